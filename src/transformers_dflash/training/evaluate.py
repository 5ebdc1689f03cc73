"""Real acceptance length (tau) of a drafter against its target: greedy speculative decoding, batch 1.

A deliberately plain loop (dynamic caches, one prompt at a time) so training can measure tau without depending on
the fast engine: prefill the target on the prompt, then repeat -- draft a block from `[last token, MASK...]`, verify
it with one target forward (`verify.greedy_verify`), keep the accepted prefix plus the target's token, crop both
caches to the committed tokens. tau is the mean number of tokens committed per target verify step.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast

from ..draft_vocab import DraftHead
from ..modeling_dflash import DFlashDraftModel, extract_context_features, hidden_state_indices
from ..verify import greedy_verify

# Transformers 5.24 renamed the model's `past_key_values` argument to `cache` (5.23 knows only the old name).
_CACHE_KWARG = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


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


@torch.no_grad()
def _generate_one(
    target: PreTrainedModel,
    drafter: DFlashDraftModel,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_ids: set[int],
) -> tuple[list[int], list[int]]:
    """Greedy speculative decoding of one prompt; returns (new tokens, committed tokens per verify step)."""
    device = next(target.parameters()).device
    layers, block = drafter.target_layer_ids, drafter.block_size
    embed, head = target.get_input_embeddings(), DraftHead()
    head.update(target.get_output_embeddings(), drafter.draft_vocab)
    target_cache, draft_cache = DynamicCache(config=target.config), DynamicCache()
    out = target(
        torch.tensor([prompt_ids], device=device),
        **{_CACHE_KWARG: target_cache},
        output_hidden_states=hidden_state_indices(layers),
        use_cache=True,
    )
    context = extract_context_features(out.hidden_states, layers)  # (1, p, F * H): features not yet in draft_cache
    last = out.logits[:, -1].argmax(dim=-1)  # (1,)
    generated, committed = [int(last)], []
    masks = torch.full((1, block - 1), drafter.mask_token_id, dtype=torch.long, device=device)
    while len(generated) < max_new_tokens and generated[-1] not in stop_ids:
        noise = embed(torch.cat([last[:, None], masks], dim=1))  # (1, B, H)
        drafted = drafter(noise_embeds=noise, context_hidden_states=context, cache=draft_cache).last_hidden_state
        draft_cache.crop(-block)  # keep only context keys/values
        draft = head(drafted)[:, 1:].argmax(dim=-1)  # (1, B - 1), as the engine drafts
        out = target(
            torch.cat([last[:, None], draft], dim=1),
            **{_CACHE_KWARG: target_cache},
            output_hidden_states=hidden_state_indices(layers),
            use_cache=True,
        )
        accepted, next_token = greedy_verify(draft, out.logits)  # logits (1, B, V): row k checks draft k
        n = int(accepted)
        target_cache.crop(-(block - 1 - n))  # the target keeps `last` and the n accepted drafts
        context = extract_context_features(out.hidden_states, layers)[:, : n + 1]
        new = draft[0, :n].tolist() + [int(next_token)]
        committed.append(n + 1)
        generated.extend(new)
        last = next_token
    stop_at = next((i + 1 for i, t in enumerate(generated) if t in stop_ids), len(generated))
    return generated[: min(stop_at, max_new_tokens)], committed


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
        for prompt in prompts:
            tokens, steps = _generate_one(target, drafter, list(prompt), max_new_tokens, set(stop_token_ids))
            outputs.append(tokens)
            committed.extend(steps)
    finally:
        drafter.train(was_training)
    histogram = [committed.count(k) for k in range(1, drafter.block_size + 1)]
    tau = sum(committed) / len(committed) if committed else 0.0
    return TauResult(tau, len(committed), sum(map(len, outputs)), histogram, time.perf_counter() - start, outputs)
