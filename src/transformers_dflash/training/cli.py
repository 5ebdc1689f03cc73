"""`dflash-train`: train a DFlash drafter for any causal LM, stage by stage or all at once.

The stages and their files are described in `arguments.DESCRIPTION` (the `--help` text); this module runs them.
All logic lives in the library (`data`, `features`, `trainer`, `export`); these functions only wire files to it.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections import Counter
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..configuration_dflash import DFlashConfig, default_target_layer_ids
from ..drafter import DFlashDraftModel
from ..pair_check import check_pair
from ..prompts import Prompt, load_prompts, write_prompts
from ..special_ids import stop_token_ids_of
from . import data
from .arguments import DEFAULT_DRAFT_LAYERS, EMBEDDED, STAGES, TRAIN_FLAGS, build_parser
from .checkpoint import latest_checkpoint
from .export import export_drafter, record_target
from .features import FeatureCache, build_feature_cache
from .magpie import SOURCE as MAGPIE
from .magpie import magpie_prompts
from .reshape import reshape_config, reshape_drafter
from .resume import check_shape_flags
from .sequences import TrainingSequence, sequences_from_responses
from .trainer import DFlashTrainer, TrainConfig

EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EVAL_SETS = ("humaneval", "mt-bench")  # benchmark sets: their prompts are removed from the training mix


def _work(args: argparse.Namespace, name: str) -> Path:
    return Path(args.work_dir) / name


def _target_name(args: argparse.Namespace) -> str:
    return args.target_name or (EMBEDDED_HUB_ID if args.target == EMBEDDED else args.target)


def load_target(args: argparse.Namespace) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """The frozen target and its tokenizer (None when the target folder has none) for --target, on --device."""
    dtype = getattr(torch, args.dtype)
    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    if args.target == EMBEDDED:
        from ..zoo import load_embedded_target

        return load_embedded_target(dtype=dtype, device=device)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
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
    """The newest checkpoint's drafter config when resuming, else --init-from's, else one shaped by the flags."""
    found = latest_checkpoint(_work(args, "checkpoints"))
    if found is not None:
        config = DFlashConfig.from_pretrained(found)
        flags: dict = {"target_layer_ids": args.target_layers, "num_hidden_layers": args.draft_layers}
        if not args.init_from:  # with --init-from the other shape flags come from there
            flags["block_size"] = args.block_size
            if args.target_layers is None:  # shallow targets have fewer distinct layers than asked for
                flags["num_features"] = len(default_target_layer_ids(config.num_target_layers, args.target_features))
            flags["mask_token_id"] = args.mask_token_id
        check_shape_flags(found, config, flags)
        return config
    if args.init_from:
        config = DFlashConfig.from_pretrained(args.init_from)
        if not (config.dflash_config or {}).get("target"):  # e.g. a z-lab checkpoint: record the target now
            record_target(config, target, _target_name(args))
        return reshape_config(config, target_layer_ids=args.target_layers, num_hidden_layers=args.draft_layers)
    mask = args.mask_token_id
    if mask is None:
        from ..zoo import choose_mask_token_id

        mask = choose_mask_token_id(_need(tokenizer, "Choosing the mask token (or pass --mask-token-id)"))
    config = DFlashConfig.from_target_config(
        target.config,
        mask_token_id=mask,
        num_hidden_layers=args.draft_layers or DEFAULT_DRAFT_LAYERS,
        block_size=args.block_size,
        num_target_features=args.target_features,
        target_layer_ids=args.target_layers,
    )
    record_target(config, target, _target_name(args))
    return config


def _source_prompts(
    args: argparse.Namespace, name: str, share: float, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> list[Prompt]:
    """The prompts of one --source; `magpie` has the target write its share plus the held-out ones (5 % spare for
    the later filters)."""
    if name != MAGPIE:
        return load_prompts(name, path=args.gsm8k if name == "gsm8k" else None)
    count = math.ceil(1.05 * (round(args.num_prompts * share) + args.num_eval))
    return magpie_prompts(
        target, tokenizer, count, args.max_prompt_tokens, batch_size=args.gen_batch_size, seed=args.seed
    )


def stage_prompts(args: argparse.Namespace, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Builds the training prompt mix and the held-out prompts."""
    sources, weights = {}, {}
    answers = {}
    for path in args.first_answers or []:
        answers |= data.own_answers(data.read_responses(path), tokenizer)
    specs = [(name, float(weight or 1.0)) for name, _, weight in (spec.partition("=") for spec in args.source)]
    total = sum(weight for _, weight in specs)
    for name, weight in specs:
        prompts = _source_prompts(args, name, weight / total, target, tokenizer)
        sources[name], dropped = data.answer_first_turns(prompts, answers, tokenizer)
        if dropped:
            print(
                f"dflash-train: {name}: dropped {dropped} of its {len(prompts)} prompts, multi-turn ones whose earlier "
                "turns have no answer (only two-turn prompts whose first turn a --first-answers file answers are kept)",
                file=sys.stderr,
            )
        if prompts and not sources[name]:
            raise ValueError(
                f"Source {name!r}: none of its {len(prompts)} multi-turn prompts has the target's own answer to its "
                "first turn. Pass --first-answers RESPONSES (an earlier responses.jsonl[.xz] whose prompts include "
                "these first turns) so the second turn is answered in context."
            )
        weights[name] = weight
    exclude = []
    for name in EVAL_SETS:
        try:
            exclude += load_prompts(name)
        except ModuleNotFoundError as error:
            print(f"dflash-train: not decontaminating against {name}: {error}", file=sys.stderr)
    for path in args.exclude_prompts or []:
        exclude += load_prompts(f"jsonl:{path}")
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


def _rows(args: argparse.Namespace, required: bool = True) -> list[dict]:
    """Response rows of every --responses file. An id found in several files (the same prompt in a regenerated and
    a reference-answer file) is prefixed by each file's stem; other ids stay as written, so the feature cache an
    earlier stage built for one file serves a run over several. Missing files raise when `required`."""
    found = {path: data.read_responses(path) for path in _response_files(args)}
    if required and (empty := [path for path, rows in found.items() if not rows]):
        raise FileNotFoundError(f"No responses in {empty[0]}; run the `responses` stage first.")
    counts = Counter(i for rows in found.values() for i in {r["id"] for r in rows})  # files holding each id
    rows = [
        {**r, "id": f"{path.stem}:{r['id']}"} if counts[r["id"]] > 1 else r
        for path, part in found.items()
        for r in part
    ]
    clashes = [i for i, n in Counter(r["id"] for r in rows).items() if n > 1]
    if clashes:
        raise ValueError(
            f"Response id {clashes[0]!r} occurs twice ({len(clashes)} such ids): a file lists it twice, or two "
            "--responses files with the same name do; rename one file or drop the repeated rows."
        )
    return rows[: args.max_sequences]


def _sequences(args: argparse.Namespace, block_size: int) -> list[TrainingSequence]:
    """The training sequences of the response rows; the summary counts rows too short to hold one block."""
    rows = _rows(args)
    sequences = sequences_from_responses(rows, block_size, args.max_seq_len)
    short = len(rows) - len(sequences)
    cut = f" (after --max-seq-len {args.max_seq_len})" if args.max_seq_len else ""
    print(
        f"dflash-train: {len(sequences)} training sequences from {len(rows)} response rows; {short} dropped: "
        f"response shorter than one block of {block_size} tokens{cut}",
        file=sys.stderr,
    )
    return sequences


def stage_features(args: argparse.Namespace, target: PreTrainedModel, config: DFlashConfig) -> None:
    """Caches the target features (and argmax for --labels target, top-k for --top-k) of every training sequence."""
    sequences = _sequences(args, config.block_size)
    build_feature_cache(
        target,
        ((s.id, s.input_ids.tolist()) for s in sequences),
        _work(args, "features"),
        config.target_layer_ids,
        with_predictions=args.labels == "target",
        total=len(sequences),
        top_k=args.top_k,
    )


def _eval_prompts(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase | None) -> list[list[int]]:
    path = _eval_file(args)
    if args.eval_prompts == 0 or tokenizer is None or not path.exists():
        return []
    prompts = load_prompts(f"jsonl:{path}")[: args.eval_prompts]
    return [tokenizer(data.chat_text(tokenizer, p), add_special_tokens=False).input_ids for p in prompts]


def initial_drafter(args: argparse.Namespace, target: PreTrainedModel, config: DFlashConfig) -> DFlashDraftModel:
    """A freshly initialised fp32 drafter for `config`, or --init-from's weights after the pair check (given
    `config`'s shape by `reshape_drafter` when --target-layers or --draft-layers change it).

    A resumed run loads its checkpoint's weights over either.
    """
    if not args.init_from:
        return DFlashDraftModel(config)
    dtype = next(target.parameters()).dtype
    saved = DFlashConfig.from_pretrained(args.init_from)
    as_saved = reshape_config(config, target_layer_ids=saved.target_layer_ids)
    as_saved.num_hidden_layers, as_saved.layer_types = saved.num_hidden_layers, getattr(saved, "layer_types", None)
    drafter = DFlashDraftModel.from_pretrained(args.init_from, config=as_saved, dtype=dtype)
    check_pair(target, drafter, same_device=False)  # a drafter trained for another target is refused here
    for change in reshape_drafter(drafter, config):
        print(f"dflash-train: {change}", file=sys.stderr)
    print(f"dflash-train: drafter initialised from {args.init_from}", file=sys.stderr)
    return drafter.float()


def stage_train(
    args: argparse.Namespace, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, config: DFlashConfig
) -> None:
    """Trains the drafter, resuming from the newest checkpoint in --work-dir."""
    torch.manual_seed(args.seed)
    drafter = initial_drafter(args, target, config)
    default = _work(args, "features")
    caches = []  # FeatureCache refuses a named folder that is not a cache; the work dir's is optional unless required
    if args.features != "online" and (args.feature_cache or (default / "meta.json").exists()):
        caches = [FeatureCache(d) for d in args.feature_cache or [default]]
    if args.features == "cache" and not caches:
        raise FileNotFoundError(f"--features cache, but there is no feature cache in {default}; run `features`.")
    train_config = TrainConfig(args.work_dir, **{field: getattr(args, dest) for dest, field in TRAIN_FLAGS.items()})
    trainer = DFlashTrainer(
        target,
        drafter,
        _sequences(args, config.block_size),
        train_config,
        eval_prompts=_eval_prompts(args, tokenizer),
        feature_cache=caches,
        stop_token_ids=stop_token_ids_of(target, None),
        run_info={
            "command": " ".join(["dflash-train", *map(shlex.quote, sys.argv[1:])]),
            **({"initialised from": args.init_from} if args.init_from else {}),
        },
    )
    trainer.train()


def stage_export(args: argparse.Namespace) -> Path:
    """Writes the newest (or --checkpoint) checkpoint in the z-lab layout with a model card."""
    found = Path(args.checkpoint) if args.checkpoint else latest_checkpoint(_work(args, "checkpoints"))
    if found is None:
        raise FileNotFoundError(f"No checkpoint under {_work(args, 'checkpoints')}; run the `train` stage first.")
    rows = _rows(args, required=False)
    counts = Counter(r.get("source", "?") for r in rows)
    tokens = sum(len(r["response_ids"]) for r in rows)
    described = None
    if rows:
        described = f"{tokens} response tokens in {len(rows)} rows: " + ", ".join(
            f"{n} {k}" for k, n in counts.items()
        )
    out = Path(args.out) if args.out else _work(args, "export")
    export_drafter(
        found,
        out,
        base_model=_target_name(args),
        dtype=getattr(torch, args.export_dtype),
        data=described,
        license=args.license,
        repo_id=args.repo_id,
        card_notes=Path(args.card_notes).read_text() if args.card_notes else None,
        tau=args.tau,
    )
    print(f"dflash-train: exported {found.name} to {out}")
    return out


def main(argv: list[str] | None = None) -> None:
    """Entry point of `dflash-train`."""
    args = build_parser().parse_args(argv)
    if getattr(args, "source", "unset") is None:
        args.source = ["gsm8k"]
    stages = STAGES[STAGES.index(args.start_at) :] if args.stage == "all" else (args.stage,)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    if stages == ("export",):
        stage_export(args)
        return
    target, tokenizer = load_target(args)
    if "prompts" in stages:
        stage_prompts(args, target, _need(tokenizer, "The prompts stage"))
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
