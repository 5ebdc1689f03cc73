"""How much of a training step is data preparation: `DFlashTrainer` on synthetic cached features, no real target.

A random target of the embedded target's shape (SmolLM2-135M-Instruct: hidden 576, 30 layers, vocabulary 49,152;
`--target-layers` fewer to start faster: only its embedding and head are used) and a feature cache of random fp16
features and argmax labels stand in for the real pair, so the step is the trainer's own: host batches from the
prefetch thread, anchors/labels/mask built on the device, the drafter's forward and backward, AdamW. Prints the
trainer's log lines (target tokens/s, data_share, target_share) and their mean after the first (warm-up) step.

    python benchmarks/train_step.py --batch-size 8 --num-anchors 512 --steps 4   # the issue-18 CPU goal: <= 10 %
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from transformers_dflash import DFlashConfig, DFlashDraftModel
from transformers_dflash.training.features import FeatureCacheWriter, TargetFeatures
from transformers_dflash.training.sequences import TrainingSequence
from transformers_dflash.training.trainer import LOG_FILE, DFlashTrainer, TrainConfig


def main() -> None:
    """Runs the measurement and prints one JSON summary line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-anchors", type=int, default=512)
    p.add_argument("--steps", type=int, default=4, help="optimizer steps (the first is reported apart as warm-up)")
    p.add_argument("--prompt-len", type=int, default=100)
    p.add_argument("--response-len", type=int, default=512)
    p.add_argument("--hidden", type=int, default=576, help="target/drafter hidden size (576: SmolLM2-135M)")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--target-layers", type=int, default=30)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--draft-vocab", type=int, default=19702, help="tokens the responses use (restricted loss head)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=int(args.hidden * 8 / 3),
        num_hidden_layers=args.target_layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        tie_word_embeddings=True, max_position_embeddings=8192,
    )  # fmt: skip
    target = LlamaForCausalLM(config).eval()
    drafter = DFlashDraftModel(
        DFlashConfig.from_target_config(config, mask_token_id=5, num_hidden_layers=args.draft_layers, block_size=16)
    )
    n = args.prompt_len + args.response_len
    sequences, words = [], torch.randperm(args.vocab)[: args.draft_vocab]
    count = args.batch_size * args.steps
    with tempfile.TemporaryDirectory() as work:
        width = args.hidden * len(drafter.target_layer_ids)
        writer = FeatureCacheWriter(Path(work) / "features", width, drafter.target_layer_ids, predictions=True)
        for i in range(count):
            ids = words[torch.randint(0, args.draft_vocab, (n,))]
            sequences.append(TrainingSequence(f"s{i}", ids, args.prompt_len))
            agree = torch.rand(n) < 0.9  # the target's argmax follows the text 90 % of the time
            predictions = torch.where(agree, torch.cat([ids[1:], ids[:1]]), words[torch.randint(0, 100, (n,))])
            writer.write(f"s{i}", TargetFeatures(torch.randn(1, n, width).half(), predictions[None]))
        writer.close()
        from transformers_dflash.training.features import FeatureCache

        train = TrainConfig(
            work, epochs=1, batch_size=args.batch_size, num_anchors=args.num_anchors, labels="target",
            restricted_vocab=True, attention="dense", log_every=1, save_every=10**9, keep_checkpoints=1,
        )  # fmt: skip
        trainer = DFlashTrainer(target, drafter, sequences, train, feature_cache=FeatureCache(Path(work) / "features"))
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        log = [json.loads(line) for line in (Path(work) / LOG_FILE).read_text().splitlines()]
    steps = [r for r in log if r["event"] == "train"]
    keys = ("target_tokens_per_s", "data_share", "target_share")
    for record in steps:
        print(json.dumps({"step": record["step"], **{k: round(record[k], 4) for k in keys}}))
    warm = steps[1:] or steps
    summary = {k: round(sum(r[k] for r in warm) / len(warm), 4) for k in keys}
    summary.update(seconds_per_step=round(seconds / len(steps), 2), torch_threads=torch.get_num_threads())
    summary.update({k: getattr(args, k) for k in ("batch_size", "num_anchors", "hidden", "draft_layers")})
    summary["tokens_per_sequence"] = n
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
