"""`verify_length="auto"`: verify only the prefix of the draft that maximises committed tokens per second.

Verifying w tokens (the anchor and w - 1 drafts) commits, in expectation, 1 + sum_{k < w} prod_{i <= k} a_i tokens,
where a_i is the chance that draft i is accepted; it is estimated by the drafter's own probability of its draft.
One step costs t_draft + t_verify(w) (t_verify(w) alone for a hybrid step that does not draft, see `hybrid.py`),
measured once per engine, batch size and block size, then corrected by the wall time of the steps the loop really
runs (bookkeeping, cache state and load included), which an isolated measurement misses. Only the number of candidates changes, never the acceptance rule, so the output stays lossless.
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
) -> tuple[float, dict[int, float]]:
    """Seconds of one `draft()` and of one `verify(width)` per width.

    Each is timed `repeats` times, round-robin over the widths (so that a burst of load on a shared machine hits
    them alike), after one warm-up (which also compiles); the best time counts. Verifying more tokens cannot
    cost less, so the verify costs are made non-decreasing in the width.
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
        costs[w] = floor
    return best["draft"], costs


class StepCosts:
    """Seconds per decoding step for each candidate verify width, with or without a draft: measured up front,
    corrected by real steps.

    Each width's cost is its measured cost (draft + verify, or verify alone for a step that does not draft) times a
    correction factor: the running average of real / measured over the steps that used that width, or, for a width
    not used in the last `horizon` steps, the factor of the nearest width that was (1 before any step). Costs stay
    non-decreasing in the width.

    One stalled step (the host paused, another process ran) must not price a width out for good: an observation
    counts at most `max_jump` times the factor it corrects, and a width that has gone unused for `horizon` steps
    forgets its factor, so the next choice prices it like its neighbours and a real step measures it again.

    Args:
        verify: seconds of the target's verify forward for each width, from [`measure_step_costs`].
        draft: seconds of the draft step.
        smoothing: weight of a new observation in the running average.
        max_jump: the largest ratio of one observation to the factor it corrects.
        horizon: steps after which an unused width's factor is forgotten.
    """

    def __init__(
        self,
        verify: dict[int, float],
        draft: float = 0.0,
        smoothing: float = 0.2,
        max_jump: float = 2.0,
        horizon: int = 64,
    ) -> None:
        self.verify, self.draft, self.smoothing = dict(sorted(verify.items())), draft, smoothing
        self.max_jump, self.horizon = max_jump, horizon
        self.factor: dict[int, float] = {}
        self.last_step: dict[int, int] = {}  # width -> the step count when it was last observed
        self.steps = 0

    def _measured(self, width: int, drafting: bool) -> float:
        return self.verify[width] + (self.draft if drafting else 0.0)

    def observe(self, width: int, seconds: float, drafting: bool = True) -> None:
        """Records the wall time of one real step that verified `width` tokens (after a draft, or without one)."""
        index = list(self.verify).index(width)
        ratio = min(seconds / self._measured(width, drafting), self.max_jump * self._factor(index))
        old = self.factor.get(width) if self._recent(width) else None
        self.factor[width] = ratio if old is None else (1 - self.smoothing) * old + self.smoothing * ratio
        self.steps += 1
        self.last_step[width] = self.steps

    def _recent(self, width: int) -> bool:
        return width in self.factor and self.steps - self.last_step[width] < self.horizon

    def _factor(self, index: int) -> float:
        widths = list(self.verify)
        used = [i for i, w in enumerate(widths) if self._recent(w)]
        if not used:
            return 1.0
        nearest = min(used, key=lambda i: (abs(i - index), -i))
        return self.factor[widths[nearest]]

    def costs(self, drafting: bool = True) -> dict[int, float]:
        """The current estimate of seconds per step, by width, for a step that drafts (or does not)."""
        out, floor = {}, 0.0
        for index, width in enumerate(self.verify):
            floor = max(floor, self._measured(width, drafting) * self._factor(index))
            out[width] = floor
        return out


def expected_tokens(confidence: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """(B,) expected tokens committed over the rows still decoding when verifying 0, 1, ... B - 1 drafts.

    Args:
        confidence: (b, B - 1) the estimated chance that each draft is accepted (the ones before it being accepted).
        done: (b,) rows that no longer decode.
    """
    expected = 1 + F.pad(torch.cumprod(confidence.float(), dim=1).cumsum(dim=1), (1, 0))  # (b, B)
    return expected.masked_fill(done[:, None], 0).sum(dim=0)


def best_width(expected: torch.Tensor, costs: dict[int, float]) -> tuple[int, float]:
    """The width with the most expected tokens per second, and that rate (tokens / s).

    Args:
        expected: (B,) expected tokens for each verify width 1..B (from [`expected_tokens`]).
        costs: seconds per step for each candidate width.
    """
    widths = list(costs)
    gains = expected[torch.tensor(widths, device=expected.device) - 1].cpu()  # the host sync
    rates = gains / torch.tensor(list(costs.values()))
    best = int(rates.argmax())
    return widths[best], float(rates[best])
