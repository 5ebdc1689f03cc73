"""Train a drafter for the embedded target (SmolLM2-135M-Instruct) within a time budget, then export it.

The H200 run of issue 18 (`train_embedded.sh` moves the target there and calls this), and its CPU test at tiny scale
(`--tiny`: a tiny random target with the embedded target's vocabulary, a few rows). Steps, each `dflash-train` in a
subprocess under a hard timeout so that an overrun never costs the export:

1. calibrate: a short run (`--cal-steps`) measures seconds per step (flex attention first on CUDA; dense if flex
   fails there);
2. train: as many epochs over the responses as fit the rest of `--budget-seconds` (at most `--max-epochs`; fewer
   sequences if not even one epoch fits), online target features, labels from the target's argmax, a checkpoint
   every quarter of the run;
3. export the newest checkpoint to OUT/drafter, with train_log.jsonl and summary.json beside it in OUT.

    python benchmarks/gpu/train_embedded.py --responses R.jsonl.xz --out OUT --device cuda --budget-seconds 420
    python benchmarks/gpu/train_embedded.py --tiny --responses R.jsonl.xz --out OUT    # CPU test, ~30 s
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "transformers_dflash.training.cli"]


def _responses(source: Path, dest: Path, limit: int | None) -> int:
    """Decompresses (`.xz`) or copies the response rows to `dest` (the first `limit`); returns the row count."""
    opener = lzma.open if source.suffix == ".xz" else open
    count = 0
    with opener(source, "rt", encoding="utf-8") as rows, dest.open("w", encoding="utf-8") as out:
        for line in rows:
            if limit is not None and count >= limit:
                break
            out.write(line)
            count += 1
    return count


def _tiny_target(folder: Path) -> None:
    """A tiny random Llama with the embedded target's vocabulary (49,152) and 8 layers, saved to `folder`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True, eos_token_id=2,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)


def _run(args: list[str], timeout: float, log: Path) -> int:
    """One `dflash-train` call, its output appended to `log`; the exit status (124 on timeout)."""
    with log.open("a") as handle:
        handle.write(f"\n$ dflash-train {' '.join(args)}\n")
        handle.flush()
        try:
            return subprocess.run([*CLI, *args], stdout=handle, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return 124


def _seconds_per_step(train_log: Path) -> float | None:
    """Mean seconds per step between the first and the last train record (the first absorbs warm-up), at least
    1 ms."""
    if not train_log.exists():
        return None
    records = [json.loads(line) for line in train_log.read_text().splitlines() if '"event": "train"' in line]
    if len(records) < 2:
        return None
    first, last = records[0], records[-1]
    seconds = (last["wall_seconds"] - first["wall_seconds"]) / max(last["step"] - first["step"], 1)
    return max(seconds, 1e-3)  # the log keeps 0.1 s: tiny steps may read as 0


def main() -> None:
    """Calibrate, train, export (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--responses", type=Path, required=True, help="response rows, .jsonl or .jsonl.xz")
    p.add_argument("--eval-file", type=Path, help="held-out prompts JSONL for a final tau (not with --tiny)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/dflash-train"))
    p.add_argument("--tiny", action="store_true", help="CPU test: tiny random target, a few rows, a few steps")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", help="target dtype (bf16 features on the GPU)")
    p.add_argument("--budget-seconds", type=float, default=420, help="calibration + training, wall clock")
    p.add_argument("--cal-steps", type=int, default=30)
    p.add_argument("--max-epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-anchors", type=int, default=512)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--attention", default="auto", choices=("auto", "flex", "dense"))
    p.add_argument("--max-rows", type=int, help="use only the first N response rows")
    args = p.parse_args()
    start = time.perf_counter()
    if args.tiny:
        args.device, args.dtype, args.attention = "cpu", "float32", "dense"
        args.max_rows, args.max_seq_len, args.num_anchors = args.max_rows or 6, min(args.max_seq_len, 64), 4
        args.batch_size, args.cal_steps, args.max_epochs = 2, 2, 1
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "train_embedded.log"
    responses = args.work / "responses.jsonl"
    rows = _responses(args.responses, responses, args.max_rows)
    target = ["--target", "embedded"]
    if args.tiny:
        _tiny_target(args.work / "target")
        target = ["--target", str(args.work / "target"), "--target-name", "tiny/random", "--mask-token-id", "5"]
    common = [*target, "--responses", str(responses), "--device", args.device, "--dtype", args.dtype]
    model = ["--draft-layers", str(args.draft_layers), "--target-features", "5", "--block-size", "16"]
    model += ["--max-seq-len", str(args.max_seq_len), "--labels", "target", "--features", "online", "--seed", "0"]
    train = ["--batch-size", str(args.batch_size), "--num-anchors", str(args.num_anchors), "--lr", "6e-4"]
    attentions = ["flex", "dense"] if args.attention == "auto" and args.device.startswith("cuda") else [args.attention]
    if attentions == ["auto"]:
        attentions = ["dense"]
    per_step, attention = None, attentions[-1]
    for attention in attentions:  # calibration: flex first on CUDA, dense when flex fails there
        cal = args.work / f"cal-{attention}"
        flags = ["--work-dir", str(cal), "--epochs", "1", "--stop-after", str(args.cal_steps)]
        flags += ["--log-every", str(max(args.cal_steps // 6, 1))]
        flags += ["--eval-prompts", "0", "--save-every", "1000000", "--attention", attention]
        status = _run(["train", *common, *model, *train, *flags], 0.3 * args.budget_seconds, log)
        per_step = _seconds_per_step(cal / "train_log.jsonl")
        if status == 0 and per_step:
            break
    if not per_step:
        print(log.read_text()[-4000:], file=sys.stderr)
        raise SystemExit("calibration failed; see train_embedded.log")
    steps_per_epoch = rows // args.batch_size  # an upper bound: rows too short for a block are dropped
    left = args.budget_seconds - (time.perf_counter() - start) - 45  # target + drafter load, final eval
    fit = max(int(0.9 * left / per_step), 1)
    epochs = max(1, min(args.max_epochs, fit // max(steps_per_epoch, 1)))
    max_rows = rows if fit >= steps_per_epoch else max(args.batch_size, fit * args.batch_size)
    run = args.work / "run"
    total = epochs * (max_rows // args.batch_size)
    flags = ["--work-dir", str(run), "--epochs", str(epochs), "--max-sequences", str(max_rows), "--log-every", "10"]
    flags += ["--attention", attention, "--save-every", str(max(total // 4, 1)), "--keep-checkpoints", "1"]
    if args.eval_file and not args.tiny:
        flags += ["--eval-file", str(args.eval_file), "--eval-prompts", "8", "--eval-every", str(10**9)]
    else:
        flags += ["--eval-prompts", "0"]
    plan = {"seconds_per_step": round(per_step, 4), "attention": attention, "epochs": epochs, "rows": max_rows}
    print(f"train_embedded: plan {plan}", flush=True)
    timeout = max(args.budget_seconds - (time.perf_counter() - start), 30)
    status = _run(["train", *common, *model, *train, *flags], timeout, log)
    exported = _run(["export", "--work-dir", str(run), "--responses", str(responses), "--out", str(args.out / "drafter")],
                    120, log)  # fmt: skip
    if (run / "train_log.jsonl").exists():
        shutil.copy(run / "train_log.jsonl", args.out / "train_log.jsonl")
    records = [json.loads(line) for line in (args.out / "train_log.jsonl").read_text().splitlines()]
    last = [r for r in records if r["event"] == "train"][-1:] or [{}]
    evals = [r for r in records if r["event"] == "eval"]
    summary = {
        **plan, "train_status": status, "export_status": exported, "seconds": round(time.perf_counter() - start, 1),
        "steps": last[0].get("step"), "target_tokens_per_s": last[0].get("target_tokens_per_s"),
        "data_share": last[0].get("data_share"), "train_accept_len": last[0].get("train_accept_len"),
        "tau": evals[-1]["tau"] if evals else None, "device": args.device, "tiny": args.tiny,
    }  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"train_embedded: {json.dumps(summary)}", flush=True)
    if exported != 0 or not math.isfinite(last[0].get("loss", float("nan"))):
        raise SystemExit(f"training or export failed (train {status}, export {exported}); see {log}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
