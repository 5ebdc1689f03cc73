"""Statistics of one engine call: acceptance (tau, histogram, per-step lengths) and timings.

Timings cost no host sync: on CUDA each lap records a pair of events that are read once, at the end of the call;
on other devices the work is synchronous and `perf_counter` measures it directly.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


class Stopwatch:
    """Accumulates the time spent in named sections without synchronising the device."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def lap(self, name: str) -> Iterator[None]:
        """Adds the time of the `with` body to `seconds[name]`."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            start_s = time.perf_counter()
            yield
            self.seconds[name] += time.perf_counter() - start_s

    def totals(self) -> dict[str, float]:
        """Seconds per section (synchronises CUDA once to read the events)."""
        if self._events:
            torch.cuda.synchronize()
            for name, start, end in self._events:
                self.seconds[name] += start.elapsed_time(end) / 1000.0
            self._events.clear()
        return dict(self.seconds)


@dataclass
class DFlashStats:
    """What one `dflash_generate` call did.

    Attributes:
        block_size: tokens per drafted block (anchor included).
        accept_lengths: per row, the tokens committed at each decoding step (accepted drafts + the target's token);
            the prefill's first token is not a step.
        verify_widths: tokens the target verified at each step (the block, or fewer with `verify_length`).
        new_tokens: generated tokens over all rows.
        total_s, prefill_s, draft_s, verify_s: wall time of the call, of the prefill (time to first token), and
            summed over steps of the drafter's and the target's forward passes.
        cache_bytes: bytes of the preallocated target and drafter caches (they do not grow during the call).
        proposers: per row, what each step verified after its anchor, with hybrid drafting (`lookup=True`):
            "drafter" (the drafter's tokens), "lookup" (looked-up tokens first) or "plain" (nothing: a plain
            decoding step); empty lists otherwise.
        draft_steps: steps that ran the drafter (hybrid drafting skips it when lookup alone is worth more).
    """

    block_size: int
    accept_lengths: list[list[int]]
    verify_widths: list[int] = field(default_factory=list)
    new_tokens: int = 0
    total_s: float = 0.0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    cache_bytes: int = 0
    proposers: list[list[str]] = field(default_factory=list)
    draft_steps: int = 0

    def __post_init__(self) -> None:
        if not self.proposers:
            self.proposers = [[] for _ in self.accept_lengths]

    @property
    def steps(self) -> int:
        """Decoding steps run (a finished row still rides along until the whole batch is done)."""
        return len(self.verify_widths)

    @property
    def tau(self) -> float:
        """Mean tokens committed per row and step (accepted + 1): the paper's acceptance length."""
        lengths = [n for row in self.accept_lengths for n in row]
        return sum(lengths) / len(lengths) if lengths else 0.0

    @property
    def histogram(self) -> list[int]:
        """`histogram[n]`: how many row-steps committed n tokens, n in 0..block_size."""
        counts = [0] * (self.block_size + 1)
        for row in self.accept_lengths:
            for n in row:
                counts[n] += 1
        return counts

    @property
    def proposer_share(self) -> dict[str, float]:
        """Share of row-steps per proposer, e.g. {"drafter": 0.7, "lookup": 0.3} ({} without hybrid drafting)."""
        names = [name for row in self.proposers for name in row]
        return {name: names.count(name) / len(names) for name in sorted(set(names))}

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens (all rows) per second of the whole call, prefill included."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def time_to_first_token_s(self) -> float:
        """Seconds until the first generated token was known (the prefill)."""
        return self.prefill_s
