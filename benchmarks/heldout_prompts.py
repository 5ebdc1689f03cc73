"""Write the 36 held-out prompts that the embedded drafter's stages are compared on (`compare_drafters.py`).

24 training-mix prompts (the first 6 of each source in the shared eval file, which no stage trained on) and the
first turns of the bench's first 4 GSM8K / HumanEval / MT-Bench prompts (`dflash-bench --max-samples 4`, seed 0),
grouped as ``mix-<source>`` and ``bench-<set>``. ``--rest`` writes the eval file's other prompts instead (40 of the
shared file's 64, grouped as ``rest-<source>``), a second, disjoint held-out set. ``--second-turns FILE`` writes second
turns answered in context instead: the bench's 4 MT-Bench second turns after the target's own greedy 96-token first
answer (as `dflash-bench`'s ``ar`` gives it; ``bench-mt-bench-t2``), then FILE's prompts (e.g.
``benchmarks/second_turns_heldout.jsonl``, ShareGPT conversations with the target's own first answers):

    python benchmarks/heldout_prompts.py --out runs/cmp/prompts.jsonl
    python benchmarks/heldout_prompts.py --rest --out runs/cmp/rest40.jsonl
    python benchmarks/heldout_prompts.py --second-turns benchmarks/second_turns_heldout.jsonl --out runs/cmp/turn2.jsonl
    python benchmarks/compare_drafters.py runs/cmp/prompts.jsonl --max-new-tokens 96 old=DIR new=DIR
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import replace

from transformers_dflash.prompts import Prompt, load_prompts, write_prompts

EVAL_FILE = "../shared/datasets/smollm2-135m-prompts-eval-2026-12-04.jsonl"
BENCH_SETS = ("gsm8k", "humaneval", "mt-bench")


def split_eval_file(eval_file: str, per_source: int = 6) -> tuple[list[Prompt], list[Prompt]]:
    """The eval file's first ``per_source`` prompts of each source (``mix-<source>``) and the rest (``rest-<source>``)."""
    taken: dict[str, list[Prompt]] = defaultdict(list)
    rest = []
    for prompt in load_prompts(f"jsonl:{eval_file}"):
        if len(taken[prompt.dataset]) < per_source:
            taken[prompt.dataset].append(replace(prompt, dataset=f"mix-{prompt.dataset}"))
        else:
            rest.append(replace(prompt, dataset=f"rest-{prompt.dataset}"))
    return [p for group in taken.values() for p in group], rest


def heldout_prompts(eval_file: str, gsm8k_path: str, per_source: int = 6, per_bench_set: int = 4) -> list[Prompt]:
    """The comparison prompts: ``per_source`` of each eval-file source, then ``per_bench_set`` first turns per set."""
    mix, _ = split_eval_file(eval_file, per_source)
    bench = [
        replace(p, dataset=f"bench-{name}", turns=p.turns[:1])
        for name in BENCH_SETS
        for p in load_prompts(name, per_bench_set, 0, path=gsm8k_path if name == "gsm8k" else None)
    ]
    return mix + bench


def mt_bench_second_turns(per_bench_set: int = 4, max_new_tokens: int = 96) -> list[Prompt]:
    """The bench's first ``per_bench_set`` MT-Bench prompts, each with the embedded target's own greedy first answer."""
    import torch

    from transformers_dflash.prompts import apply_chat
    from transformers_dflash.zoo import load_embedded_target

    target, tokenizer = load_embedded_target()
    prompts = []
    for p in load_prompts("mt-bench", per_bench_set, 0):
        text = apply_chat(tokenizer, [{"role": "user", "content": p.turns[0]}])
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids  # (1, P)
        with torch.inference_mode():
            out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)  # (1, P + new)
        answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        prompts.append(replace(p, dataset="bench-mt-bench-t2", turns=p.turns[:2], answers=[answer]))
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval-file", default=EVAL_FILE, help="the shared eval prompts (default: %(default)s)")
    parser.add_argument("--gsm8k-path", default="benchmarks/gsm8k_heldout.jsonl", help="(default: %(default)s)")
    parser.add_argument("--rest", action="store_true", help="write the eval prompts the 36 leave out instead")
    parser.add_argument("--second-turns", metavar="FILE", help="write second turns answered in context (see above)")
    parser.add_argument("--out", default="runs/cmp/prompts.jsonl", help="(default: %(default)s)")
    args = parser.parse_args()
    if args.second_turns:
        prompts = mt_bench_second_turns() + load_prompts(f"jsonl:{args.second_turns}")
    elif args.rest:
        prompts = split_eval_file(args.eval_file)[1]
    else:
        prompts = heldout_prompts(args.eval_file, args.gsm8k_path)
    print(f"{len(prompts)} prompts -> {write_prompts(prompts, args.out)}")


if __name__ == "__main__":
    main()
