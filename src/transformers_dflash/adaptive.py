"""`verify_length="auto"`: verify only the prefix of the draft that maximises committed tokens per second.

Verifying w tokens (the anchor and w - 1 drafts) commits, in expectation, 1 + sum_{k < w} prod_{i <= k} a_i tokens,
where a_i is the chance that draft i is accepted; it is estimated by the drafter's own probability of its draft.
One step costs t_draft + t_verify(w), measured once per engine, batch size and block size, then corrected by the
wall time of the steps the loop really runs (bookkeeping, cache state and load included), which an isolated
measurement misses. Only the number of candidates changes, never the acceptance rule, so the output stays lossless.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F


def candidate_widths(block_size: int) -> list[int]:
    """Verify widths worth measuring: 1 (the anchor alone: a plain decoding step), powers of two, the whole block."""
    return sorted({min(2**i, block_size) for i in range(block_size.bit_length() + 1)})


def measure_step_costs(
    draft: Callable[[], object],
    verify: Callable[[int], object],
    widths: list[int],
    device: torch.device,
    repeats: int = 5,
) -> dict[int, float]:
    """Seconds of one step per verify width: `draft()` plus `verify(width)`.

    Each is timed `repeats` times, round-robin over the widths (so that a burst of load on a shared machine hits
    them alike), after one warm-up (which also compiles); the best time counts. Verifying more tokens cannot
    cost less, so the costs are made non-decreasing in the width.
    """
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    runs = {"draft": draft, **{w: (lambda w=w: verify(w)) for w in widths}}
    best = dict.fromkeys(runs, float("inf"))
    for repeat in range(repeats + 1):
        for name, run in runs.items():
            sync()
            start = time.perf_counter()
            run()
            sync()
            if repeat:
                best[name] = min(best[name], time.perf_counter() - start)
    costs, floor = {}, 0.0
    for w in widths:
        floor = max(floor, best[w])
        costs[w] = best["draft"] + floor
    return costs


class StepCosts:
    """Seconds per decoding step for each candidate verify width: measured up front, corrected by real steps.

    Each width's cost is its measured cost times a correction factor: the running average of real / measured over
    the steps that used it, or, for a width not used yet, the factor of the nearest width that was (1 before any
    step). Costs stay non-decreasing in the width.

    Args:
        measured: seconds per step for each width, from [`measure_step_costs`].
        smoothing: weight of a new observation in the running average.
    """

    def __init__(self, measured: dict[int, float], smoothing: float = 0.2) -> None:
        self.measured, self.smoothing = dict(sorted(measured.items())), smoothing
        self.factor: dict[int, float] = {}

    def observe(self, width: int, seconds: float) -> None:
        """Records the wall time of one real step that verified `width` tokens."""
        ratio = seconds / self.measured[width]
        old = self.factor.get(width)
        self.factor[width] = ratio if old is None else (1 - self.smoothing) * old + self.smoothing * ratio

    def _factor(self, index: int) -> float:
        widths = list(self.measured)
        used = [i for i, w in enumerate(widths) if w in self.factor]
        if not used:
            return 1.0
        nearest = min(used, key=lambda i: (abs(i - index), -i))
        return self.factor[widths[nearest]]

    def costs(self) -> dict[int, float]:
        """The current estimate of seconds per step, by width."""
        out, floor = {}, 0.0
        for index, (width, measured) in enumerate(self.measured.items()):
            floor = max(floor, measured * self._factor(index))
            out[width] = floor
        return out


def choose_width(confidence: torch.Tensor, done: torch.Tensor, costs: dict[int, float]) -> int:
    """The measured width with the most expected committed tokens per second over the rows still decoding.

    Args:
        confidence: (b, B - 1) the drafter's probability of each of its drafts.
        done: (b,) rows that no longer decode.
        costs: seconds per step for each candidate width.
    """
    expected = 1 + F.pad(torch.cumprod(confidence.float(), dim=1).cumsum(dim=1), (1, 0))  # (b, B): 0, 1, ... drafts
    expected = expected.masked_fill(done[:, None], 0).sum(dim=0)  # (B,)
    widths = list(costs)
    gains = expected[torch.tensor(widths, device=expected.device) - 1].cpu()  # the host sync
    return widths[int((gains / torch.tensor(list(costs.values()))).argmax())]
