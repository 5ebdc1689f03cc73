"""The logic of the Gradio demo (`spaces_demo/app.py`): plain decoding and DFlash side by side, streamed.

The app only lays out widgets; everything it shows comes from here:

* the allowlist of model pairs: the embedded pair, plus pairs the Space's owner names in ``$DFLASH_DEMO_PAIRS``
  (JSON ``{"name": {"target": "/dir", "drafter": "/dir"}}`` of local folders). A visitor picks a name, never a
  path; nothing is loaded with remote code and weights are read from safetensors only;
* the bounds on a request (prompt length, max new tokens, block size, temperature);
* :func:`stream_comparison`: plain `generate`, then the DFlash engine, one after the other (they never compete for
  the CPU), each streamed with its live tokens/s, then the speed-up, tau, the acceptance histogram and, under
  greedy decoding, the check that both produced the same token ids. Any failure becomes a readable message;
* example prompts from the offline prompt sets.

Which pairs exist and how they load is `demo_pairs`; what the panes look like (HTML, colours, the histogram) is
`demo_view`; both are re-exported here for the app.
"""

from __future__ import annotations

import gc
import logging
import queue
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer

from .demo_pairs import (
    EMBEDDED_PAIR,
    PAIRS_ENV,
    LoadedPair,
    PairSpec,
    allowed_pairs,
    default_pair,
    drafter_block_size,
    load_pair,
    pair_note,
    pair_problem,
)
from .demo_view import (
    OKABE_ITO,
    PANE_CSS,
    DemoView,
    Pane,
    TokenTexts,
    acceptance_figure,
    blocks_html,
    identity_check,
    legend_html,
    pane_html,
    show,
)
from .engine import DFlashOutput, dflash_generate
from .prompts import Prompt, apply_chat, load_prompts
from .showcase import SHOWCASE_PROMPTS
from .special_ids import stop_token_ids_of

__all__ = [
    "EMBEDDED_PAIR", "LIMITS", "OKABE_ITO", "PAIRS_ENV", "PANE_CSS", "DemoError", "DemoView", "Limits", "LoadedPair",
    "PairCache", "PairSpec", "Settings", "StepStreamer", "StreamedCall", "allowed_pairs", "blocks_html",
    "default_pair", "drafter_block_size", "example_prompts", "legend_html", "load_pair", "pair_note", "pair_problem",
    "pane_html", "stream_comparison",
]  # fmt: skip

logger = logging.getLogger(__name__)

_MT_BENCH_MATH = range(111, 121)  # FastChat MT-Bench question ids by category
_MT_BENCH_CHAT = range(81, 101)  # writing, roleplay


class DemoError(ValueError):
    """A request the demo refuses, with a message meant for the visitor."""


@dataclass(frozen=True)
class Limits:
    """Bounds on one request (a Space shares one small CPU between visitors)."""

    max_prompt_chars: int = 4000
    max_prompt_tokens: int = 1024
    max_new_tokens: int = 512
    max_temperature: float = 2.0


LIMITS = Limits()


class PairCache:
    """Keeps one pair loaded (a Space has little memory) and warms it up so that timings are steady."""

    def __init__(self, pairs: Mapping[str, PairSpec]) -> None:
        self.pairs = dict(pairs)
        self._loaded: LoadedPair | None = None
        self._lock = threading.Lock()

    def get(self, name: str) -> LoadedPair:
        """The loaded pair `name`, loading it (and dropping the previous one) when needed."""
        if name not in self.pairs:
            raise DemoError(f"Unknown model pair {name!r}; choose one from the list.")
        with self._lock:
            if self._loaded is None or self._loaded.name != name:
                self._loaded = None
                gc.collect()
                pair = load_pair(self.pairs[name])
                warm = encode_prompt(pair, "Hello", LIMITS)
                for run in (_plain_call, _dflash_call):
                    run(pair, warm, Settings(4, pair.block_size, 0.0), None)
                self._loaded = pair
            return self._loaded


@dataclass(frozen=True)
class Settings:
    """What a visitor set: tokens to generate, DFlash block size, temperature (0 = greedy)."""

    max_new_tokens: int
    block_size: int
    temperature: float


def encode_prompt(pair: LoadedPair, prompt: str, limits: Limits) -> torch.LongTensor:
    """(1, P) ids of the prompt as one user turn of the target's chat template, within the limits."""
    prompt = (prompt or "").strip()
    if not prompt:
        raise DemoError("Type a prompt first (or pick an example).")
    if len(prompt) > limits.max_prompt_chars:
        raise DemoError(f"The prompt has {len(prompt)} characters; the limit is {limits.max_prompt_chars}.")
    text = apply_chat(pair.tokenizer, [{"role": "user", "content": prompt}])
    templated = bool(getattr(pair.tokenizer, "chat_template", None))
    ids = pair.tokenizer(text, return_tensors="pt", add_special_tokens=not templated).input_ids
    if ids.shape[1] > limits.max_prompt_tokens:
        raise DemoError(f"The prompt has {ids.shape[1]} tokens; the limit is {limits.max_prompt_tokens}.")
    return ids


def check_settings(pair: LoadedPair, settings: Settings, prompt_tokens: int, limits: Limits) -> None:
    """Raises a [`DemoError`] for settings outside the bounds of the demo and of the pair."""
    if not 1 <= settings.max_new_tokens <= limits.max_new_tokens:
        raise DemoError(f"Max new tokens must be between 1 and {limits.max_new_tokens}.")
    if not 2 <= settings.block_size <= pair.block_size:
        raise DemoError(f"Block size must be between 2 and {pair.block_size} (the drafter's trained block size).")
    if not 0.0 <= settings.temperature <= limits.max_temperature:
        raise DemoError(f"Temperature must be between 0 (greedy) and {limits.max_temperature}.")
    room = getattr(pair.target.config.get_text_config(), "max_position_embeddings", None)
    if room is not None and prompt_tokens + settings.max_new_tokens > room:
        raise DemoError(f"Prompt + max new tokens exceed the target's context ({room} tokens); ask for fewer tokens.")


def _plain_call(
    pair: LoadedPair, ids: torch.LongTensor, settings: Settings, streamer: BaseStreamer | None
) -> torch.LongTensor:
    """The target alone, through Transformers' `generate`: the new token ids (n,)."""
    sampling = {"do_sample": True, "temperature": settings.temperature, "top_p": 1.0, "top_k": 0}
    out = pair.target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=settings.max_new_tokens,
        eos_token_id=stop_token_ids_of(pair.target, None),
        pad_token_id=pair.target.generation_config.pad_token_id,
        streamer=streamer,
        **(sampling if settings.temperature > 0 else {"do_sample": False}),
    )
    return out[0, ids.shape[1] :]


def _dflash_call(
    pair: LoadedPair, ids: torch.LongTensor, settings: Settings, streamer: BaseStreamer | None
) -> DFlashOutput:
    """The DFlash engine on the same request, with hybrid drafting and the verify width worth its cost."""
    return dflash_generate(
        pair.target,
        pair.drafter,
        ids,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        stop_token_ids=stop_token_ids_of(pair.target, None),
        streamer=streamer,
        block_size=settings.block_size,
        verify_length="auto",
        lookup=True,  # hybrid drafting: the fastest engine setting on the embedded pair (README, "Hybrid drafting")
    )


class _Cancelled(Exception):
    """Raised inside a generation whose visitor went away, to stop it early."""


class StepStreamer(BaseStreamer):
    """Hands each `put` after the prompt (one decoding step's committed tokens) to a queue, as a list of ids."""

    def __init__(self) -> None:
        self.steps: queue.Queue[list[int] | None] = queue.Queue()
        self.cancelled = threading.Event()
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        """Queue one step's tokens (the first call, the prompt, is skipped)."""
        if self.cancelled.is_set():
            raise _Cancelled
        if self._prompt_seen:
            self.steps.put([int(t) for t in value.reshape(-1).tolist()])
        self._prompt_seen = True

    def end(self) -> None:
        """Mark the end of the stream."""
        self.steps.put(None)


class StreamedCall:
    """Runs `call(streamer)` in a thread; iterating yields each step's tokens as the call streams them.

    After the iteration, `result` is what the call returned and `seconds` its wall time. An exception of the call
    is raised by the iteration; `cancel()` stops the call at its next step (a visitor who left).
    """

    def __init__(self, call: Callable[[BaseStreamer], Any]) -> None:
        self.call, self.streamer = call, StepStreamer()
        self.result: Any = None
        self.seconds = 0.0
        self._error: Exception | None = None

    def _work(self) -> None:
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                self.result = self.call(self.streamer)
        except Exception as exc:  # handed to the iterating thread, which re-raises it
            self._error = exc
        finally:
            self.seconds = time.perf_counter() - start
            self.streamer.end()

    def __iter__(self) -> Iterator[list[int]]:
        thread = threading.Thread(target=self._work, name="dflash-demo-generate", daemon=True)
        thread.start()
        while (step := self.streamer.steps.get()) is not None:
            yield step
        thread.join()
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        """Stop the call at its next streamed step."""
        self.streamer.cancelled.set()


def _readable(exc: Exception) -> str:
    if isinstance(exc, DemoError):
        return f"⚠️ {exc}"
    return f"⚠️ The run failed: {type(exc).__name__}: {exc}. The demo is still running; try again."


def stream_comparison(
    cache: PairCache,
    pair_name: str,
    prompt: str,
    settings: Settings,
    limits: Limits = LIMITS,
    refresh_s: float = 0.25,
) -> Iterator[DemoView]:
    """Plain decoding, then DFlash, on one prompt: yields a [`DemoView`] as the panes fill, then the results.

    Views are yielded at most every `refresh_s` seconds while a pane streams. A failure ends the stream with a view
    whose `status` says what went wrong (it is also logged); nothing is raised.
    """
    view = DemoView(status=f"Loading {pair_name}…")
    try:
        yield replace(view)
        pair = cache.get(pair_name)
        ids = encode_prompt(pair, prompt, limits)
        check_settings(pair, settings, ids.shape[1], limits)
        prompt_ids, outputs = ids[0].tolist(), {}
        panes = {side: Pane(TokenTexts(pair.tokenizer, prompt_ids)) for side in ("plain", "dflash")}
        for side, call in (("plain", _plain_call), ("dflash", _dflash_call)):
            view.status = f"Running {'plain decoding' if side == 'plain' else 'DFlash'}…"
            pane, stream = panes[side], StreamedCall(lambda streamer, call=call: call(pair, ids, settings, streamer))
            start = last = time.perf_counter()
            try:
                for step in stream:
                    pane.texts.extend(step)
                    pane.steps.append(len(step))
                    if (now := time.perf_counter()) - last >= refresh_s:
                        last, pane.seconds = now, now - start
                        show(view, side, pane, done=False)
                        yield replace(view)
            finally:
                stream.cancel()
            pane.seconds, outputs[side] = stream.seconds, stream.result
            show(view, side, pane, done=True)
            yield replace(view)
        stats = outputs["dflash"].stats
        plain_ids = outputs["plain"].tolist()
        dflash_ids = outputs["dflash"].sequences[0, len(prompt_ids) : len(prompt_ids) + stats.new_tokens].tolist()
        plain, fast = panes["plain"], panes["dflash"]
        speedup = fast.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else 0.0
        view.summary = (
            f"### Speed-up ×{speedup:.2f}\nDFlash {fast.tokens_per_second:.1f} tokens/s vs plain "
            f"{plain.tokens_per_second:.1f} tokens/s · **τ = {stats.tau:.2f}** tokens per step over "
            f"{stats.steps} steps (block size {settings.block_size})"
        )
        view.identical = identity_check(plain_ids, dflash_ids, settings.temperature)
        view.histogram = acceptance_figure(stats)
        view.status = "Done."
        yield replace(view)
    except Exception as exc:  # the UI boundary: any failure becomes a message, and the app keeps serving
        logger.exception("demo run failed")
        view.status = _readable(exc)
        yield replace(view)


def _mt_bench(ids: range) -> list[Prompt]:
    return [p for p in load_prompts("mt-bench") if int(p.id.rsplit("-", 1)[1]) in ids]


def example_prompts(limits: Limits = LIMITS, per_kind: int = 2) -> list[tuple[str, str]]:
    """`(label, prompt)` examples, `per_kind` each of math, code and chat, from the offline prompt sets installed.

    Math comes from GSM8K when ``$DFLASH_GSM8K`` names its JSONL file, else from MT-Bench's math questions; code
    from HumanEval; chat from MT-Bench's writing and roleplay questions. A kind whose sets are all missing falls
    back to the showcase's built-in prompts of that kind.
    """
    sources: dict[str, list[Callable[[], list[Prompt]]]] = {
        "math": [lambda: load_prompts("gsm8k", max_samples=per_kind), lambda: _mt_bench(_MT_BENCH_MATH)],
        "code": [lambda: load_prompts("humaneval", max_samples=per_kind)],
        "chat": [lambda: _mt_bench(_MT_BENCH_CHAT)],
    }
    examples: list[tuple[str, str]] = []
    for kind, loaders in sources.items():
        texts = [text for k, text in SHOWCASE_PROMPTS if k == kind]
        for load in loaders:
            try:
                texts = [p.turns[0] for p in load()]
                break
            except (ImportError, OSError, ValueError) as exc:  # the set's package or data file is not installed
                logger.info("no %s examples from this set: %s", kind, exc)
        examples += [(_label(kind, text), text) for text in texts if len(text) <= limits.max_prompt_chars][:per_kind]
    return examples


def _label(kind: str, text: str) -> str:
    """`kind: <first line>` (for code, the first `def` line), shortened for an example button."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = next((line for line in lines if line.startswith("def ")), lines[0])
    return f"{kind}: {textwrap.shorten(line, 64, placeholder=' …')}"
