"""What limits block position 1 for the embedded target: how predictable its next token is, from its own view.

Runs the fp32 target (SmolLM2-135M-Instruct) teacher-forced over some of its own greedy responses (the shared bf16
set) and reads, at every response position, its top-1 probability and the margin to the runner-up for the next
token; then runs a drafter on blocks anchored there and buckets its position-1 accuracy (against the target's
argmax, the label the trainer uses) by the target's own top-1 probability. A token the target itself gives 0.3 is
one a 2-layer drafter, which sees the same context only through 5 feature layers, rarely matches.

    python benchmarks/ceiling.py --rows 24 --max-response 256 --anchors 48    # ~2 min on 2 CPU cores

Several `--drafter NAME=DIR` share one target pass (its features cover every layer any of them reads), so drafters
that read different target layers (e.g. with and without the target's last layer) are compared on the same blocks.
"""

from __future__ import annotations

import argparse
import json
import lzma
import time

import torch
from tqdm.auto import tqdm

from transformers_dflash import DFlashDraftModel
from transformers_dflash.training.anchors import anchor_keys, anchor_slots, draw_anchors
from transformers_dflash.training.blocks import build_block_batch, labels_from_predictions, loss_weights
from transformers_dflash.training.features import capture_features
from transformers_dflash.zoo import load_embedded_target

BUCKETS = ((0.0, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01))


def main() -> None:
    """Prints a JSON summary and a markdown table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--responses", default="/work/shared/datasets/smollm2-135m-responses-h200-2026-12-04.jsonl.xz")
    p.add_argument(
        "--drafter",
        action="append",
        metavar="[NAME=]DIR",
        help="drafter folder, repeatable (default: the shipped model_cards/SmolLM2-135M-Instruct-DFlash-b16)",
    )
    p.add_argument("--rows", type=int, default=24, help="responses read (default: %(default)s)")
    p.add_argument("--stride", type=int, default=50, help="read every N-th row, for a spread of sources (default: 50)")
    p.add_argument("--max-response", type=int, default=256, help="response tokens kept per row")
    p.add_argument("--anchors", type=int, default=48, help="drafter blocks per row")
    args = p.parse_args()
    start = time.perf_counter()
    target, _ = load_embedded_target(dtype=torch.float32, device="cpu")
    drafters = {}
    for spec in args.drafter or ["model_cards/SmolLM2-135M-Instruct-DFlash-b16"]:
        name, _, folder = spec.rpartition("=")
        drafters[name or folder] = DFlashDraftModel.from_pretrained(folder, dtype=torch.float32).eval()
    layers = sorted({i for d in drafters.values() for i in d.target_layer_ids})  # one pass serves every drafter
    if len({d.block_size for d in drafters.values()}) > 1:
        raise SystemExit("ceiling.py: the drafters must share one block size (their blocks are compared one to one).")
    head = target.get_output_embeddings().weight  # (V, H)
    opener = lzma.open if args.responses.endswith(".xz") else open
    with opener(args.responses, "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for i, line in enumerate(handle) if i % args.stride == 0][: args.rows]
    top1, margin, follows, bucket_of = [], [], [], []
    hit: dict[str, list[torch.Tensor]] = {name: [] for name in drafters}
    for index, row in enumerate(tqdm(rows, desc="rows")):
        prompt, response = row["prompt_ids"], row["response_ids"][: args.max_response]
        ids = torch.tensor([prompt + response])  # (1, n)
        n, start_r = ids.shape[1], len(prompt)
        feats = capture_features(target, ids, layers, top_k=2)
        per_layer = feats.hidden.view(1, n, len(layers), -1)  # (1, n, L, H)
        probs = feats.top_logprobs[0].exp()  # (n, 2): the target's top-2 for the token after each position
        span = slice(start_r - 1, n - 1)  # positions whose next token is a response token
        top1.append(probs[span, 0])
        margin.append(probs[span, 0] - probs[span, 1])
        follows.append(feats.predictions[0, span] == ids[0, start_r:])  # the bf16 text vs the fp32 argmax
        lengths, starts = torch.tensor([n]), torch.tensor([start_r])
        keys = anchor_keys(0, 0, torch.tensor([index]))
        targets = labels_from_predictions(ids, feats.predictions)
        for name, drafter in drafters.items():
            slots = anchor_slots(lengths, starts, drafter.block_size, args.anchors)
            anchors, count = draw_anchors(lengths, starts, keys, drafter.block_size, args.anchors, slots, n)
            batch = build_block_batch(
                ids,
                targets,
                anchors,
                count,
                drafter.block_size,
                drafter.mask_token_id,
                loss_weights(drafter.block_size),
            )
            context = per_layer[:, :, [layers.index(i) for i in drafter.target_layer_ids]].reshape(1, n, -1)
            with torch.no_grad():
                hidden = drafter(
                    noise_embeds=target.get_input_embeddings()(batch.noise_ids),
                    context_hidden_states=context,
                    position_ids=batch.position_ids,
                    attention_mask=batch.attention_mask,
                ).last_hidden_state[0, 1 :: drafter.block_size]  # (a, H): block position 1 of each block
                logits = hidden @ head.T  # (a, V)
                allowed = drafter.draft_vocab  # inference proposes only these tokens
                if allowed is not None:
                    logits = torch.full_like(logits, float("-inf")).index_copy(1, allowed, logits[:, allowed])
            real = anchors[0, : count[0]]
            hit[name].append(logits[: len(real)].argmax(-1) == feats.predictions[0, real])  # predicts anchor + 1
        bucket_of.append(probs[real, 0])  # the target's own top-1 probability for that token
    top1, margin, follows, bucket_of = torch.cat(top1), torch.cat(margin), torch.cat(follows), torch.cat(bucket_of)
    hits = {name: torch.cat(h).float() for name, h in hit.items()}
    table = []
    for low, high in BUCKETS:
        chosen = (bucket_of >= low) & (bucket_of < high)
        table.append({
            "p_top1": f"[{low:.1f}, {min(high, 1.0):.1f}{']' if high > 1 else ')'}",
            "share": ((top1 >= low) & (top1 < high)).float().mean().item(), "blocks": int(chosen.sum()),
            **{f"acc1:{name}": h[chosen].mean().item() if chosen.any() else float("nan") for name, h in hits.items()},
        })  # fmt: skip
    summary = {
        "rows": len(rows), "response_tokens": int(top1.numel()), "blocks": int(bucket_of.numel()),
        "mean_p_top1": top1.mean().item(), "median_p_top1": top1.median().item(),
        "mean_margin": margin.mean().item(), "share_margin_below_0.2": (margin < 0.2).float().mean().item(),
        "bf16_text_follows_fp32_argmax": follows.float().mean().item(),
        **{f"acc1:{name}": h.mean().item() for name, h in hits.items()},
        "share_blocks_p_top1_at_least_0.9": ((bucket_of >= 0.9).float().mean()).item(),
        "seconds": round(time.perf_counter() - start, 1),
    }  # fmt: skip
    print(json.dumps({**summary, "by_p_top1": table}, indent=1))
    names = list(hits)
    print("\n| target top-1 probability | share of response tokens | blocks | " + " | ".join(
        f"position-1 accuracy: {name}" for name in names) + " |")  # fmt: skip
    print("|---|---:|---:|" + "---:|" * len(names))
    for r in table:
        accs = " | ".join(f"{r[f'acc1:{name}']:.1%}" for name in names)
        print(f"| {r['p_top1']} | {r['share']:.1%} | {r['blocks']} | {accs} |")
    print(f"| all | | {summary['blocks']} | " + " | ".join(f"{summary[f'acc1:{name}']:.1%}" for name in names) + " |")


if __name__ == "__main__":
    main()
