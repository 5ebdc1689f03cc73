"""Real acceptance length (tau) of a drafter against its target: greedy speculative decoding by the engine.

Each prompt is decoded alone (batch 1) by [`DFlashEngine`], the loop every other caller uses; tau is the mean number
of tokens committed per target verify step, read from the engine's statistics.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from ..engine import DFlashEngine
from ..modeling_dflash import DFlashDraftModel


@dataclass
class TauResult:
    """Acceptance statistics over a set of prompts.

    Attributes:
        tau: mean tokens committed per verify step (accepted drafts + the target's own token), in 1..block_size.
        steps: verify steps run.
        new_tokens: tokens generated.
        histogram: `histogram[k - 1]` = steps that committed k tokens.
        seconds: wall time.
        outputs: the generated ids of each prompt (equal to the target's own greedy output).
    """

    tau: float
    steps: int
    new_tokens: int
    histogram: list[int]
    seconds: float
    outputs: list[list[int]] = field(default_factory=list)


def _in_dtype(drafter: DFlashDraftModel, dtype: torch.dtype) -> DFlashDraftModel:
    """The drafter itself when it has `dtype`, else an eval-mode copy in `dtype` (training keeps an fp32 drafter
    beside a bf16 target; the engine, like the exported drafter, runs both in one dtype)."""
    weight = next(drafter.parameters())
    if weight.dtype == dtype:
        return drafter
    copy = type(drafter)(drafter.config).to(device=weight.device, dtype=dtype).eval()
    copy.load_state_dict(drafter.state_dict())
    copy.set_draft_vocab(drafter.draft_vocab)
    return copy


def measure_tau(
    target: PreTrainedModel,
    drafter: DFlashDraftModel,
    prompts: Iterable[list[int]],
    max_new_tokens: int = 128,
    stop_token_ids: Iterable[int] = (),
) -> TauResult:
    """Greedy speculative decoding of each prompt (token ids, chat template applied) and its acceptance length."""
    was_training = drafter.training
    drafter.eval()
    start = time.perf_counter()
    outputs, committed = [], []
    try:
        engine = DFlashEngine(target, _in_dtype(drafter, next(target.parameters()).dtype))
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], device=target.device)  # (1, P)
            result = engine.generate(ids, max_new_tokens=max_new_tokens, stop_token_ids=list(stop_token_ids))
            outputs.append(result.sequences[0, ids.shape[1] :].tolist())
            committed.extend(result.stats.accept_lengths[0])
    finally:
        drafter.train(was_training)
    histogram = [committed.count(k) for k in range(1, drafter.block_size + 1)]
    tau = sum(committed) / len(committed) if committed else 0.0
    return TauResult(tau, len(committed), sum(map(len, outputs)), histogram, time.perf_counter() - start, outputs)
