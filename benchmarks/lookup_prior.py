"""How often a prompt-lookup token is right, by match length and position: the prior of `ngram_lookup.py`.

Replays prompt lookup (`NgramLookup`, n = 1..8, the latest occurrence, period-extended) over the embedded target's
own greedy responses (the shared H200 set): at every response position it proposes the next 15 tokens from the
prompt and the response so far and compares them with what the target really wrote. It prints, per match length n,
the chance that the first looked-up token is right, and that the token at position 1, 2 and 3+ is right given every
one before it was: the numbers `ngram_lookup.PRIOR` holds, which a row's own record then refines.

    python benchmarks/lookup_prior.py --every 25    # 287 responses, ~1 min, no model needed
"""

from __future__ import annotations

import argparse
import json
import lzma

from transformers_dflash.ngram_lookup import MAX_NGRAM, POSITIONS, NgramLookup


def main() -> None:
    """Prints the table and the tuple to paste into `ngram_lookup.PRIOR`."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--responses", default="/work/shared/datasets/smollm2-135m-responses-h200-2026-12-04.jsonl.xz")
    p.add_argument("--every", type=int, default=25, help="read every N-th response")
    p.add_argument("--look-ahead", type=int, default=15, help="tokens proposed per position (block size - 1)")
    args = p.parse_args()
    tally = NgramLookup([])  # its record, summed over every response: per n and position, right and judged tokens
    rows = 0
    with lzma.open(args.responses, "rt") as f:
        for i, line in enumerate(f):
            if i % args.every:
                continue
            row, rows = json.loads(line), rows + 1
            lookup, response = NgramLookup(row["prompt_ids"]), row["response_ids"]
            for t in range(len(response) - 1):
                proposed, n = lookup.propose(args.look_ahead)
                pairs = list(zip(proposed, response[t : t + args.look_ahead], strict=False))
                right = next((j for j, (guess, real) in enumerate(pairs) if guess != real), len(pairs))
                if n:
                    tally.record(n, len(pairs), right)
                lookup.extend(response[t : t + 1])
    print(f"{rows} responses; chance a looked-up token is right, given the ones before it were (judged tokens):\n")
    print("| n | " + " | ".join(f"position {j}{'+' if j == POSITIONS - 1 else ''}" for j in range(POSITIONS)) + " |")
    print("|---:|" + "---:|" * POSITIONS)
    prior = []
    for n in range(1, MAX_NGRAM + 1):
        hits, tries = tally.hits[n], tally.tries[n]
        rates = [h / t if t else 0.0 for h, t in zip(hits, tries, strict=True)]
        prior.append(tuple(round(r, 2) for r in rates))
        cells = " | ".join(f"{r:.2f} ({t})" for r, t in zip(rates, tries, strict=True))
        print(f"| {n}{'+' if n == MAX_NGRAM else ''} | {cells} |")
    print(f"\nPRIOR = {tuple(prior)}")


if __name__ == "__main__":
    main()
