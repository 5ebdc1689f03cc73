"""The decoding methods `dflash-bench` compares, in one registry of validated names.

Each method turns one prompt into its new token ids (and, for speculative methods, the tokens committed per verify
step). Adding one is a decorated function:

    @register_method("my-method", help="...")
    def my_method(ctx: MethodContext, input_ids: torch.LongTensor, variant: Variant) -> Generation: ...

How acceptance lengths are counted for the methods that run inside Transformers' `generate` (dflash-native,
prompt-lookup, assisted): the candidate generator `generate` builds for the call is wrapped. Its
`update_candidate_strategy(input_ids, scores, num_matches)` runs once per target verify forward with the number of
drafted tokens kept (after the cut at EOS and max length), so that step committed `num_matches + 1` tokens. The
first target forward is the prefill: when it verified no drafted token (always so for DFlash, whose drafter needs the
prefill's hidden states) it is not a step, exactly as the engine's prefill token is not one. tau is then committed
tokens / steps for every method alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel

from .drafter_types import as_native_drafter


@dataclass
class GenerationSettings:
    """What every method is asked to do, identically.

    Attributes:
        max_new_tokens: new tokens per prompt turn at most.
        temperature: 0 for greedy decoding; otherwise sampling (with `top_p`, `top_k`; 0 disables top-k).
        prompt_lookup_tokens: drafted tokens per step for `prompt-lookup` (`prompt_lookup_num_tokens`).
        verify_length: drafts the fast engine verifies per step (None: all; an int; "auto"), see `dflash_generate`.
        compile: `torch.compile` the fast engine's draft and verify steps.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    prompt_lookup_tokens: int = 10
    verify_length: int | str | None = None
    compile: bool = False

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy, so lossless methods must reproduce `ar` token for token."""
        return self.temperature <= 0


@dataclass
class MethodContext:
    """The models and settings a method runs with.

    Attributes:
        target: the target model.
        drafter: its DFlash drafter (needed by `dflash` and `dflash-native`).
        assistants: small autoregressive draft models for `assisted:NAME`, by NAME.
        settings: the generation settings shared by all methods.
        initial_draft_lengths: each assistant's `num_assistant_tokens` before its first call, restored before every
            call so that Transformers' heuristic draft length does not carry over from one prompt to the next.
    """

    target: PreTrainedModel
    drafter: nn.Module | None = None
    assistants: dict[str, PreTrainedModel] = field(default_factory=dict)
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    initial_draft_lengths: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def generate_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `target.generate` for plain greedy or sampled decoding."""
        s = self.settings
        kwargs: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "do_sample": not s.greedy}
        if not s.greedy:
            kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        return kwargs


@dataclass
class Generation:
    """One method's answer to one prompt turn.

    Attributes:
        ids: the new token ids (prompt excluded).
        accept_lengths: tokens committed per verify step (None for non-speculative methods).
        timings: extra timings in seconds the method reports itself (e.g. the engine's draft/verify split).
    """

    ids: list[int]
    accept_lengths: list[int] | None = None
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchMethod:
    """A registered method.

    Attributes:
        name: registry name (what `--methods` takes).
        run: `run(ctx, input_ids, variant) -> Generation`; `input_ids` is (1, P).
        help: one line for `--help`.
        lossless: True when greedy output must equal `ar` exactly (checked on every greedy run).
        uses_block_size: run once per benchmarked block size.
        needs_drafter: needs `MethodContext.drafter`.
        argument: name of the required `name:ARG` argument (e.g. "MODEL"), or None for none.
    """

    name: str
    run: Callable[[MethodContext, torch.LongTensor, Variant], Generation]
    help: str
    lossless: bool = True
    uses_block_size: bool = False
    needs_drafter: bool = False
    argument: str | None = None


@dataclass(frozen=True)
class Variant:
    """One column of the benchmark: a method with its argument and block size."""

    method: BenchMethod
    argument: str | None = None
    block_size: int | None = None

    @property
    def label(self) -> str:
        """`ar`, `dflash@b16`, `assisted:PATH`: how tables, plots and the JSON name this variant."""
        name = self.method.name if self.argument is None else f"{self.method.name}:{self.argument}"
        return name if self.block_size is None else f"{name}@b{self.block_size}"


METHODS: dict[str, BenchMethod] = {}
BASELINE = "ar"


def register_method(
    name: str,
    *,
    help: str,
    lossless: bool = True,
    uses_block_size: bool = False,
    needs_drafter: bool = False,
    argument: str | None = None,
) -> Callable[[Callable[[MethodContext, torch.LongTensor, Variant], Generation]], BenchMethod]:
    """Decorator adding a method to [`METHODS`] under `name` (an existing name raises a ValueError)."""
    if name in METHODS:
        raise ValueError(f"A bench method named {name!r} is already registered.")

    def register(run: Callable[[MethodContext, torch.LongTensor, Variant], Generation]) -> BenchMethod:
        method = BenchMethod(name, run, help, lossless, uses_block_size, needs_drafter, argument)
        METHODS[name] = method
        return method

    return register


def resolve_variants(specs: list[str], block_sizes: list[int]) -> list[Variant]:
    """The variants for `--methods` names (`ar` first, added when missing) and `--block-sizes`.

    Raises:
        ValueError: an unknown name, a missing or unexpected `:ARG`, a repeated method, or a block size below 2.
    """
    bad_sizes = [b for b in block_sizes if b < 2]
    if bad_sizes or len(set(block_sizes)) != len(block_sizes):
        raise ValueError(f"Block sizes must be distinct integers >= 2 (anchor + drafts), got {block_sizes}.")
    valid = ", ".join(m.name if m.argument is None else f"{m.name}:{m.argument}" for m in METHODS.values())
    parsed: list[tuple[BenchMethod, str | None]] = []
    for spec in specs:
        name, sep, argument = spec.strip().partition(":")
        method = METHODS.get(name)
        if method is None:
            raise ValueError(f"Unknown bench method {spec!r}; valid: {valid}.")
        if method.argument is not None and not argument:
            raise ValueError(f"Method {name!r} needs an argument: {name}:{method.argument}.")
        if method.argument is None and sep:
            raise ValueError(f"Method {name!r} takes no argument, got {spec!r}.")
        if (method, argument or None) in parsed:
            raise ValueError(f"Method {spec!r} is listed twice.")
        parsed.append((method, argument or None))
    if all(method.name != BASELINE for method, _ in parsed):
        parsed.insert(0, (METHODS[BASELINE], None))  # the reference every speed-up and lossless check needs
    return [
        Variant(method, argument, block)
        for method, argument in parsed
        for block in (block_sizes if method.uses_block_size else [None])
    ]


def _new_ids(sequences: torch.Tensor, prompt_length: int) -> list[int]:
    return sequences[0, prompt_length:].tolist()


@contextmanager
def counted_accepts(target: PreTrainedModel) -> Iterator[list[int]]:
    """Collects tokens committed per verify step of the assisted `generate` calls made inside (see module doc)."""
    lengths: list[int] = []
    original = target._get_candidate_generator  # bound method, as `generate` calls it

    def build(*args: Any, **kwargs: Any) -> Any:
        generator = original(*args, **kwargs)
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy
        state = {"first": True, "drafted": 0}

        def counted_get_candidates(input_ids: torch.LongTensor, *a: Any, **k: Any) -> Any:
            candidates, logits = get_candidates(input_ids, *a, **k)
            state["drafted"] = candidates.shape[1] - input_ids.shape[1]
            return candidates, logits

        def counted_update(input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: Any) -> Any:
            if not (state["first"] and state["drafted"] == 0):  # a prefill that verified nothing is not a step
                lengths.append(int(num_matches) + 1)
            state["first"] = False
            return update(input_ids, scores, num_matches)

        generator.get_candidates, generator.update_candidate_strategy = counted_get_candidates, counted_update
        return generator

    if not hasattr(GenerationMixin, "_get_candidate_generator"):
        import transformers

        raise RuntimeError(f"transformers {transformers.__version__} has no `_get_candidate_generator` to count with.")
    target._get_candidate_generator = build  # instance attribute: shadows the class method for this model only
    try:
        yield lengths
    finally:
        del target._get_candidate_generator


def _speculative_generate(ctx: MethodContext, input_ids: torch.LongTensor, **kwargs: Any) -> Generation:
    """`target.generate` with a candidate generator, its accept lengths counted."""
    with counted_accepts(ctx.target) as lengths:
        sequences = ctx.target.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), **ctx.generate_kwargs(), **kwargs
        )
    return Generation(_new_ids(sequences, input_ids.shape[1]), list(lengths))


@contextmanager
def _drafter_block_size(drafter: nn.Module, block_size: int) -> Iterator[nn.Module]:
    """The native drafter with `config.block_size` set to `block_size` inside (Transformers reads it from there)."""
    native = as_native_drafter(drafter)
    trained = native.config.block_size
    native.config.block_size = block_size
    try:
        yield native
    finally:
        native.config.block_size = trained


@register_method(BASELINE, help="plain target.generate (greedy or sampled): the reference")
def _ar(ctx: MethodContext, input_ids: torch.LongTensor, variant: Variant) -> Generation:
    sequences = ctx.target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **ctx.generate_kwargs())
    return Generation(_new_ids(sequences, input_ids.shape[1]))


@register_method("ar-engine", help="plain AR on the engine's loop and static cache (ar_generate; compiled: --compile)")
def _ar_engine(ctx: MethodContext, input_ids: torch.LongTensor, variant: Variant) -> Generation:
    from .ar import ar_generate

    s = ctx.settings
    out = ar_generate(
        ctx.target, input_ids, max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
        top_k=s.top_k, compile=s.compile,
    )  # fmt: skip
    return Generation(_new_ids(out.sequences, input_ids.shape[1]), out.stats.accept_lengths[0])  # tau 1


def _engine_generate(
    ctx: MethodContext,
    input_ids: torch.LongTensor,
    variant: Variant,
    verify_length: int | str | None,
    lookup: bool = False,
) -> Generation:
    """The fast engine on one prompt turn, with its draft/verify time split."""
    from .engine import dflash_generate

    s = ctx.settings
    out = dflash_generate(
        ctx.target,
        ctx.drafter,
        input_ids,
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        block_size=variant.block_size,
        verify_length=verify_length,
        return_stats=True,
        compile=s.compile,
        lookup=lookup,
    )
    stats = out.stats
    timings = {"time_to_first_token_s": stats.prefill_s, "draft_s": stats.draft_s, "verify_s": stats.verify_s}
    return Generation(_new_ids(out.sequences, input_ids.shape[1]), stats.accept_lengths[0], timings)


@register_method("dflash", help="the fast DFlash engine (dflash_generate)", uses_block_size=True, needs_drafter=True)
def _dflash(ctx: MethodContext, input_ids: torch.LongTensor, variant: Variant) -> Generation:
    return _engine_generate(ctx, input_ids, variant, ctx.settings.verify_length)


@register_method(
    "dflash-auto",
    help="the fast engine verifying, per step, only the draft prefix worth its measured cost (verify_length='auto')",
    uses_block_size=True,
    needs_drafter=True,
)
def _dflash_auto(ctx: MethodContext, input_ids: torch.LongTensor, variant: Variant) -> Generation:
    return _engine_generate(ctx, input_ids, variant, "auto")


@register_method(
    "dflash-hybrid",
    help="the fast engine with hybrid drafting: per step the drafter's block or the prompt-lookup continuation, "
    "whichever is expected to commit more, at the verify width worth its cost (lookup=True, verify_length='auto')",
    uses_block_size=True,
    needs_drafter=True,
)
def _dflash_hybrid(ctx: MethodContext, input_ids: torch.LongTensor, variant: Variant) -> Generation:
    return _engine_generate(ctx, input_ids, variant, "auto", lookup=True)


@register_method(
    "dflash-native",
    help="Transformers' own DFlash path: generate(assistant_model=drafter, speculation_type='dflash')",
    uses_block_size=True,
    needs_drafter=True,
)
def _dflash_native(ctx: MethodContext, input_ids: torch.LongTensor, variant: Variant) -> Generation:
    with _drafter_block_size(ctx.drafter, variant.block_size) as drafter:
        return _speculative_generate(ctx, input_ids, assistant_model=drafter, speculation_type="dflash")


@register_method("prompt-lookup", help="n-gram prompt lookup: generate(prompt_lookup_num_tokens=...)")
def _prompt_lookup(ctx: MethodContext, input_ids: torch.LongTensor, variant: Variant) -> Generation:
    return _speculative_generate(ctx, input_ids, prompt_lookup_num_tokens=ctx.settings.prompt_lookup_tokens)


@register_method(
    "assisted",
    help="classic speculative decoding with a small AR draft model of the same tokenizer (a local folder)",
    argument="MODEL",
)
def _assisted(ctx: MethodContext, input_ids: torch.LongTensor, variant: Variant) -> Generation:
    assistant = ctx.assistants.get(variant.argument)
    if assistant is None:
        raise ValueError(f"No assistant model loaded for {variant.label!r}; pass assistants={{name: model}}.")
    # `generate` stores its heuristic draft length on the assistant between calls; start every prompt the same.
    config = assistant.generation_config
    config.num_assistant_tokens = ctx.initial_draft_lengths.setdefault(variant.argument, config.num_assistant_tokens)
    return _speculative_generate(ctx, input_ids, assistant_model=assistant)
