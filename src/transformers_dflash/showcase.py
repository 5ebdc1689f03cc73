"""`make run`: the embedded pair on a handful of real prompts, plain decoding against DFlash, side by side.

For each prompt (math, code, chat) it runs the target alone (`generate`, greedy) and the DFlash engine, checks
the outputs are identical token for token, and prints tokens/s, the speed-up and tau; then the acceptance-length
histogram over all prompts. Everything runs offline on the CPU.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from dataclasses import dataclass

import torch
import transformers
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .drafter import DFlashDraftModel
from .engine import dflash_generate
from .validation import parse_verify_length
from .zoo import embedded_drafter_dir, load_embedded_target

SHOWCASE_PROMPTS: list[tuple[str, str]] = [
    (
        "math",
        "A baker makes 24 muffins in the morning and 18 in the afternoon. He sells 30 and gives 5 to a friend. "
        "How many muffins are left?\nPlease reason step by step, and put your final answer within \\boxed{}.",
    ),
    (
        "math",
        "Tom reads 12 pages a day for 5 days, then 20 pages a day for 3 days. How many pages did he read in "
        "total?\nPlease reason step by step, and put your final answer within \\boxed{}.",
    ),
    ("code", "Write a Python function `is_palindrome(s: str) -> bool` that ignores case and spaces."),
    ("code", "Write a Python function that returns the n-th Fibonacci number iteratively."),
    ("chat", "Give me three tips for staying focused while studying."),
]


@dataclass
class ShowcaseRow:
    """One prompt's side-by-side figures."""

    kind: str
    new_tokens: int
    ar_tokens_per_s: float
    dflash_tokens_per_s: float
    tau: float
    identical: bool
    accept_lengths: list[int]

    @property
    def speedup(self) -> float:
        """DFlash tokens/s over plain tokens/s."""
        return self.dflash_tokens_per_s / self.ar_tokens_per_s if self.ar_tokens_per_s else 0.0


def run_prompt(
    target: PreTrainedModel,
    drafter: DFlashDraftModel,
    tokenizer: PreTrainedTokenizerBase,
    kind: str,
    text: str,
    max_new_tokens: int,
    verify_length: int | str | None = "auto",
    lookup: bool = True,
) -> ShowcaseRow:
    """Plain greedy `generate`, then the DFlash engine (verifying `verify_length` drafts per step, with hybrid
    drafting when `lookup`), on one prompt."""
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(chat, return_tensors="pt", add_special_tokens=False).input_ids
    start = time.perf_counter()
    with torch.inference_mode():
        plain = target.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
        )
    ar_s = time.perf_counter() - start
    result = dflash_generate(
        target,
        drafter,
        ids,
        max_new_tokens=max_new_tokens,
        return_stats=True,
        verify_length=verify_length,
        lookup=lookup,
    )
    fast = result.sequences[:, : plain.shape[1]]
    new = plain.shape[1] - ids.shape[1]
    stats = result.stats
    return ShowcaseRow(
        kind=kind,
        new_tokens=new,
        ar_tokens_per_s=new / ar_s,
        dflash_tokens_per_s=stats.new_tokens / stats.total_s,
        tau=stats.tau,
        identical=torch.equal(fast, plain) and result.sequences.shape[1] >= plain.shape[1],
        accept_lengths=stats.accept_lengths[0],
    )


def print_histogram(lengths: list[int], block_size: int) -> None:
    """A text bar chart of tokens committed per step."""
    counts = [lengths.count(n) for n in range(block_size + 1)]
    top = max(counts) or 1
    print("\nacceptance length (tokens committed per step) histogram:")
    for n, c in enumerate(counts):
        if n and (c or n <= max(lengths, default=0)):
            print(f"  {n:2d} | {'#' * round(40 * c / top):<40} {c}")


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m transformers_dflash` (`make run`)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument(
        "--verify-length",
        type=parse_verify_length,
        default="auto",
        help="drafts the target verifies per step: 'auto' (default: the width worth its measured cost), 'all', or N",
    )
    parser.add_argument(
        "--lookup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hybrid drafting: the drafter's block or the prompt-lookup continuation per step (default: on)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__} "
        f"({args.threads} threads), transformers {transformers.__version__}"
    )
    target, tokenizer = load_embedded_target()
    drafter = DFlashDraftModel.from_pretrained(embedded_drafter_dir()).to(target.dtype).eval()
    print(f"target: {target.config.name_or_path or 'SmolLM2-135M-Instruct'}; drafter: {embedded_drafter_dir()}")
    print(f"verify length: {args.verify_length or 'all'} (--verify-length), hybrid drafting: {args.lookup} (--lookup)")
    run_prompt(target, drafter, tokenizer, *SHOWCASE_PROMPTS[0], 8, args.verify_length, args.lookup)  # warm-up
    rows = []
    print(f"\n{'kind':<6}{'new':>5}{'plain tok/s':>13}{'DFlash tok/s':>14}{'speed-up':>10}{'tau':>7}  identical")
    for kind, text in SHOWCASE_PROMPTS:
        row = run_prompt(target, drafter, tokenizer, kind, text, args.max_new_tokens, args.verify_length, args.lookup)
        rows.append(row)
        print(
            f"{row.kind:<6}{row.new_tokens:>5}{row.ar_tokens_per_s:>13.1f}{row.dflash_tokens_per_s:>14.1f}"
            f"{row.speedup:>9.2f}x{row.tau:>7.2f}  {'yes' if row.identical else 'NO  <-- MISMATCH'}"
        )
    lengths = [n for row in rows for n in row.accept_lengths]
    print(
        f"\nmedian speed-up {statistics.median(r.speedup for r in rows):.2f}x, "
        f"tau {sum(lengths) / max(len(lengths), 1):.2f}, identical outputs: {sum(r.identical for r in rows)}/{len(rows)}"
    )
    print_histogram(lengths, drafter.config.block_size)
    if not all(r.identical for r in rows):
        raise SystemExit("DFlash output differed from plain decoding: this is a bug, please report it.")
