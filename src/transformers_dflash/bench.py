"""dflash-bench: DFlash against AR, Transformers' native DFlash path, prompt lookup and an AR drafter, side by side.

How the timing is kept fair:
- every variant first runs once on the first prompt (a warm-up that is not recorded);
- the variants are interleaved per prompt turn, the order rotating by one from one prompt turn to the next;
- every variant sees the same prompt and the same torch seed; an MT-Bench second turn follows `ar`'s own first
  answer, so all variants answer the same second-turn prompt;
- torch threads are fixed (and printed with the machine), figures are medians over prompt turns.
Greedy outputs of every lossless method are compared with `ar` token for token, and any difference is reported
loudly (console, JSON, `results.md`). Results are saved after each prompt turn; Ctrl-C keeps every prompt turn that
all variants finished.

Library use (models as objects, prompts as [`Prompt`]s):

    result = run_benchmark(target, tokenizer, prompts, drafter=drafter, methods=["ar", "dflash"], out_dir="out")
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .bench_methods import BASELINE, METHODS, Generation, GenerationSettings, MethodContext, Variant, resolve_variants
from .bench_models import DTYPES, drafter_folder, load_assistant, load_drafter, load_target
from .bench_plots import write_plots
from .bench_report import (
    BenchResult,
    Sample,
    format_machine,
    format_mismatches,
    format_table,
    machine_info,
    write_markdown,
)
from .drafter_types import as_native_drafter
from .pair_check import check_pair
from .prompts import Prompt, apply_chat, load_prompts
from .quantization import quantization_of
from .validation import parse_verify_length

DEFAULT_METHODS = ("ar", "dflash", "dflash-auto", "dflash-native", "prompt-lookup")
DEFAULT_DATASETS = ("gsm8k", "humaneval", "mt-bench")


def encode(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], device: torch.device) -> torch.Tensor:
    """(1, P) ids of a conversation rendered through the chat template, ready for the assistant's turn."""
    text = apply_chat(tokenizer, messages)
    return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids.to(device)


def _timed(ctx: MethodContext, variant: Variant, input_ids: torch.Tensor, seed: int) -> tuple[Generation, float]:
    """Runs one variant with the torch seed set, returning its generation and wall seconds (device synced)."""
    device = input_ids.device
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.inference_mode():
        generation = variant.method.run(ctx, input_ids, variant)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return generation, time.perf_counter() - start


def _sample(
    prompt: Prompt, turn: int, variant: Variant, seed: int, input_ids: torch.Tensor, ctx: MethodContext
) -> Sample:
    generation, seconds = _timed(ctx, variant, input_ids, seed)
    lengths = generation.accept_lengths
    return Sample(
        dataset=prompt.dataset,
        prompt_id=prompt.id,
        turn=turn,
        method=variant.label,
        block_size=variant.block_size,
        seed=seed,
        prompt_tokens=int(input_ids.shape[1]),
        new_tokens=len(generation.ids),
        seconds=seconds,
        tokens_per_second=len(generation.ids) / seconds if seconds > 0 else 0.0,
        tau=sum(lengths) / len(lengths) if lengths else None,
        accept_lengths=lengths,
        output_ids=generation.ids,
        timings=generation.timings,
    )


def _run_turn(
    ctx: MethodContext,
    variants: list[Variant],
    prompt: Prompt,
    turn: int,
    input_ids: torch.Tensor,
    seed: int,
    bar: tqdm,
) -> list[Sample]:
    """Every variant, in the given order, on one prompt turn; greedy outputs of lossless ones checked against `ar`."""
    done: list[tuple[Variant, Sample]] = []
    for variant in variants:
        bar.set_postfix_str(f"{prompt.id} turn {turn}: {variant.label}")
        done.append((variant, _sample(prompt, turn, variant, seed, input_ids, ctx)))
    reference = next(s.output_ids for v, s in done if v.method.name == BASELINE)
    for variant, sample in done:
        lossless = variant.method.lossless and variant.method.name != BASELINE
        if ctx.settings.greedy and lossless and not sample.compare_to(reference):
            tqdm.write(
                f"!!! LOSSLESS CHECK FAILED: {sample.method} differs from ar on {prompt.id} turn {turn} "
                f"at new token {sample.first_mismatch} !!!",
                file=sys.stderr,
            )
    return [sample for _, sample in done]


def _check_inputs(
    variants: list[Variant], drafter: nn.Module | None, assistants: dict[str, PreTrainedModel], prompts: list[Prompt]
) -> None:
    if not prompts:
        raise ValueError("No prompts to benchmark.")
    needing = [v.label for v in variants if v.method.needs_drafter]
    if needing and drafter is None:
        raise ValueError(f"Methods {needing} need a DFlash drafter; pass drafter=... (--drafter).")
    missing = [v.argument for v in variants if v.method.argument and v.argument not in assistants]
    if missing:
        raise ValueError(f"No assistant model given for {missing}; pass assistants={{name: model}}.")


def run_benchmark(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Prompt],
    *,
    drafter: nn.Module | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    block_sizes: Sequence[int] | None = None,
    settings: GenerationSettings | None = None,
    assistants: dict[str, PreTrainedModel] | None = None,
    seed: int = 0,
    warmup: bool = True,
    out_dir: str | Path | None = None,
    progress: bool = True,
    command: str | None = None,
) -> BenchResult:
    """Runs every method variant on every prompt turn and returns what was measured (see the module doc).

    Args:
        target, tokenizer: the target model and its tokenizer (prompts go through its chat template).
        prompts: the prompt turns to answer; `Prompt.dataset` groups them in the summary.
        drafter: the DFlash drafter (needed by `dflash` and `dflash-native`).
        methods: registry names (`bench_methods.METHODS`), `assisted:NAME` with NAME a key of `assistants`;
            `ar` is added first when missing.
        block_sizes: block sizes of the block-size methods (default: the drafter's own).
        settings: generation settings shared by all methods (default: greedy, 128 new tokens).
        assistants: small AR draft models for `assisted:NAME`.
        seed: the torch seed of prompt turn k is `seed + k`, for every variant.
        warmup: run each variant once on the first prompt, unrecorded, before timing.
        out_dir: when given, `results.json` is rewritten after each prompt turn, and `results.md`, `speedup.png`,
            `acceptance.png` are written at the end (also after Ctrl-C).
        progress: show a progress bar over prompt turns.
        command: the command line to record in the results.

    Returns:
        The [`BenchResult`]; `complete` is False when Ctrl-C stopped the run.

    Raises:
        ValueError: bad method names or block sizes, a missing drafter/assistant, or a drafter that does not fit.
    """
    settings = settings or GenerationSettings()
    assistants = dict(assistants or {})
    if block_sizes is None:
        block_sizes = [as_native_drafter(drafter).config.block_size] if drafter is not None else []
    variants = resolve_variants(list(methods), list(block_sizes))
    _check_inputs(variants, drafter, assistants, prompts)
    if drafter is not None:
        check_pair(target, drafter)
    ctx = MethodContext(target, drafter, assistants, settings)
    device = target.device
    result = BenchResult(
        config={
            "command": command,
            "target": target.name_or_path,
            "drafter": getattr(drafter, "name_or_path", None) if drafter is not None else None,
            "methods": list(methods),
            "block_sizes": list(block_sizes),
            "settings": dataclasses.asdict(settings),
            "seed": seed,
            "warmup": warmup,
            "dtype": str(target.dtype),
            "quantization": quantization_of(target),
            "datasets": list(dict.fromkeys(p.dataset for p in prompts)),
            "prompts": len(prompts),
        },
        machine=machine_info(device),
        methods=[v.label for v in variants],
    )
    json_path = Path(out_dir) / "results.json" if out_dir is not None else None
    bar = tqdm(total=sum(len(p.turns) for p in prompts), desc="dflash-bench", unit="turn", disable=not progress)
    try:
        if warmup:
            first = encode(tokenizer, [{"role": "user", "content": prompts[0].turns[0]}], device)
            for variant in variants:
                bar.set_postfix_str(f"warm-up {variant.label}")
                _timed(ctx, variant, first, seed)
        k = 0
        for prompt in prompts:
            history: list[dict[str, str]] = []
            for turn, text in enumerate(prompt.turns):
                messages = [*history, {"role": "user", "content": text}]
                input_ids = encode(tokenizer, messages, device)
                rotated = variants[k % len(variants) :] + variants[: k % len(variants)]
                samples = _run_turn(ctx, rotated, prompt, turn, input_ids, seed + k, bar)
                result.samples += samples  # a prompt turn counts once every variant has answered it
                reference = next(s.output_ids for s in samples if s.method == BASELINE)
                answer = tokenizer.decode(reference, skip_special_tokens=True)
                history = [*messages, {"role": "assistant", "content": answer}]
                k += 1
                bar.update()
                if json_path is not None:
                    result.save_json(json_path)
        result.complete = True
    except KeyboardInterrupt:
        tqdm.write(f"dflash-bench: interrupted; keeping the {len(result.samples)} samples measured so far.")
    finally:
        bar.close()
        if json_path is not None:
            result.save_json(json_path)
    if out_dir is not None:
        write_markdown(result, Path(out_dir) / "results.md")
        write_plots(result, out_dir)
    return result


def _gsm8k_path(given: str | None) -> str | None:
    """The GSM8K file the user named (--gsm8k-path, else $DFLASH_GSM8K); None: no GSM8K (it ships in no package;
    a checkout's `make bench` passes benchmarks/gsm8k_heldout.jsonl)."""
    return given or os.environ.get("DFLASH_GSM8K") or None


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The `dflash-bench` argument parser."""
    methods = "\n".join(
        f"  {m.name if m.argument is None else f'{m.name}:{m.argument}'}: {m.help}" for m in METHODS.values()
    )
    parser = argparse.ArgumentParser(
        prog="dflash-bench",
        description="Benchmark DFlash against AR decoding, Transformers' DFlash path, prompt lookup and assisted "
        "decoding: tokens/s, speed-up, tau, acceptance histograms, lossless check; table, JSON and plots.",
        epilog=f"methods:\n{methods}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--target", help="target model folder (default: the embedded SmolLM2-135M-Instruct)")
    add("--drafter", help="DFlash drafter folder (default: the shipped SmolLM2-135M-Instruct-DFlash-b16)")
    add("--dataset", default=None, help="comma list of gsm8k, humaneval, mt-bench, sharegpt, jsonl:PATH, hub:REPO[:CONFIG][@SPLIT] "
        f"(default: {','.join(DEFAULT_DATASETS)}, gsm8k only when a GSM8K file is found)")  # fmt: skip
    add("--gsm8k-path", help="GSM8K JSONL, e.g. a checkout's benchmarks/gsm8k_heldout.jsonl (default: $DFLASH_GSM8K)")
    add("--exclude-prompts", help="comma list of JSONL prompt files (e.g. a drafter's prompts.train.jsonl) whose "
        "prompts are left out before sampling, so a benchmark on a training source stays held out")  # fmt: skip
    add("--max-samples", type=int, default=4, help="prompts per dataset, a seeded random subset (default 4)")
    add("--max-new-tokens", type=int, default=128, help="new tokens per prompt turn (default 128)")
    add("--block-sizes", default=None, help="comma list of block sizes for dflash/dflash-native (default: drafter's)")
    add("--methods", default=",".join(DEFAULT_METHODS), help="comma list (default: %(default)s); see below")
    add("--temperature", type=float, default=0.0, help="0 = greedy, checked lossless against ar (default 0)")
    add("--top-p", type=float, default=1.0)
    add("--top-k", type=int, default=0)
    add("--seed", type=int, default=0, help="prompt subset seed and torch seed base (default 0)")
    add("--prompt-lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens (default 10)")
    add(
        "--verify-length",
        type=parse_verify_length,
        default=None,
        help="dflash engine: drafts verified per step: 'all' (default), an int, or 'auto'",
    )
    add(
        "--compile",
        action="store_true",
        help="dflash and ar-engine: torch.compile the engine's steps (the warm-up and each new cache size compile)",
    )
    add("--quantize", help="quantize the target at load time (int8-weight-only, int8-dynamic on CPU; int4-weight-only, "
        "bnb-4bit on CUDA) and run every method on the full-precision and the quantized target side by side")  # fmt: skip
    add("--full-precision-target", help="with a --target folder saved quantized: its full-precision folder, to "
        "compare with side by side (as --quantize does)")  # fmt: skip
    add("--threads", type=int, default=None, help="torch threads (default: torch's default, printed)")
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--dtype", choices=sorted(DTYPES), default="float32")
    add("--no-warmup", action="store_true", help="skip the unrecorded warm-up run of each method")
    add("--no-progress", action="store_true", help="no progress bar")
    add("--fail-on-mismatch", action="store_true", help="exit with code 1 when a greedy output differs from ar")
    add("--out", default="results", help="output folder for results.json/.md and PNG plots (default: results)")
    return parser


def _setup(args: argparse.Namespace) -> dict:
    """Everything `run_benchmark` needs from the command line; raises ValueError/OSError with a clear message."""
    methods = _csv(args.methods)
    dtype, device = DTYPES[args.dtype], torch.device(args.device)
    block_sizes = [int(b) for b in _csv(args.block_sizes)] if args.block_sizes else None
    variants = resolve_variants(methods, block_sizes or [2])  # a bad name fails before anything is loaded
    folder = drafter_folder(args.drafter) if any(v.method.needs_drafter for v in variants) else None
    gsm8k = _gsm8k_path(args.gsm8k_path)
    if args.dataset:
        datasets = _csv(args.dataset)
    else:
        datasets = [d for d in DEFAULT_DATASETS if d != "gsm8k" or gsm8k]
        if not gsm8k:
            print("dflash-bench: no GSM8K file found (--gsm8k-path, $DFLASH_GSM8K): skipping gsm8k.", file=sys.stderr)
    exclude = [p for file in _csv(args.exclude_prompts or "") for p in load_prompts(f"jsonl:{file}")]
    prompts = [
        p
        for name in datasets
        for p in load_prompts(
            name, args.max_samples, args.seed, path=gsm8k if name == "gsm8k" else None, exclude=exclude
        )
    ]
    target, tokenizer = load_target(args.target, dtype, device, args.quantize)
    full = args.full_precision_target or (args.target if args.quantize else None)
    compared = {"full_target": load_target(full, dtype, device)[0]} if args.quantize or full else {}
    drafter = load_drafter(folder, dtype, device) if folder is not None else None
    if drafter is not None:
        check_pair(target, drafter)
    names = dict.fromkeys(v.argument for v in variants if v.method.argument)
    assistants = {name: load_assistant(name, tokenizer, dtype, device) for name in names}
    settings = GenerationSettings(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        prompt_lookup_tokens=args.prompt_lookup_tokens,
        verify_length=args.verify_length,
        compile=args.compile,
    )
    return dict(target=target, tokenizer=tokenizer, prompts=prompts, drafter=drafter, methods=methods,
                block_sizes=block_sizes, settings=settings, assistants=assistants, **compared)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """`dflash-bench`: returns the exit code (0; 1 on a mismatch with --fail-on-mismatch; 2 bad input; 130 Ctrl-C)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or torch.get_num_threads())
    try:
        setup = _setup(args)
    except (ValueError, OSError, ImportError) as error:  # OSError covers a missing model folder or data file
        print(f"dflash-bench: error: {error}", file=sys.stderr)
        return 2
    print(format_machine(machine_info(setup["target"].device)))
    command = shlex.join(["dflash-bench", *(sys.argv[1:] if argv is None else argv)])
    run = dict(
        seed=args.seed, warmup=not args.no_warmup, out_dir=args.out, progress=not args.no_progress, command=command
    )
    if "full_target" in setup:
        from .bench_quantized import format_comparison, run_quantized_comparison

        comparison = run_quantized_comparison(**setup, **run, method=args.quantize)
        result = comparison.quantized
        print(format_comparison(comparison))
    else:
        result = run_benchmark(**setup, **run)
        print(format_table(result))
    if result.mismatches:
        print(format_mismatches(result), file=sys.stderr)
    print(f"dflash-bench: wrote results.json, results.md, speedup.png, acceptance.png to {args.out}")
    if not result.complete:
        return 130
    return 1 if result.mismatches and args.fail_on_mismatch else 0


if __name__ == "__main__":
    raise SystemExit(main())
