"""Acceptance rules: which drafted tokens the target keeps, and the token it adds. Shared by every loop.

Both rules are lossless. Greedy keeps the longest prefix of the draft equal to the target's argmax and adds the
target's argmax after it, so the output is exactly the target's greedy output. Sampling is speculative sampling
(Leviathan et al., 2023): draft token d at position k is kept with probability min(1, p_k(d) / q_k(d)); at the
first rejection the target's token is drawn from the residual max(p - q, 0), renormalised; after a fully
accepted block it is drawn from p. The committed tokens are then distributed exactly as the target's samples.
With `draft_probs=None` the draft is treated as deterministic (q is one-hot at the drafted token): acceptance is
p_k(d) and the rule equals "accept while the target's own sample matches the draft".
"""

from __future__ import annotations

import torch


def warp_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Probabilities (float32, same shape as `logits` (..., V)) after temperature, top-k then top-p.

    The order and tie handling follow Transformers' `TemperatureLogitsWarper`, `TopKLogitsWarper` and
    `TopPLogitsWarper` (at least one token is always kept).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}; use greedy decoding for 0.")
    scores = logits.float() / temperature
    if top_k and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - top_p)
        drop_sorted[..., -1] = False
        scores = scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return scores.softmax(dim=-1)


def greedy_verify(draft_ids: torch.LongTensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance for a batch of drafts.

    Args:
        draft_ids: (b, k) drafted tokens.
        target_logits: (b, k + 1, V) target logits at the anchor and at each drafted position; or the target's
            argmax ids already, (b, k + 1) integer.

    Returns:
        accepted: (b,) number of drafted tokens kept, in 0..k.
        next_token: (b,) the target's own token after them.
    """
    target_ids = target_logits if not target_logits.is_floating_point() else target_logits.argmax(dim=-1)
    k = draft_ids.shape[1]
    matches = (draft_ids == target_ids[:, :k]).int()  # (b, k)
    accepted = matches.cumprod(dim=1).sum(dim=1)  # (b,)
    next_token = target_ids.gather(1, accepted[:, None]).squeeze(1)
    return accepted, next_token


def speculative_verify(
    draft_ids: torch.LongTensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless speculative-sampling acceptance for a batch of drafts.

    Args:
        draft_ids: (b, k) drafted tokens (sampled from `draft_probs`, or deterministic when it is None).
        target_probs: (b, k + 1, V) the target's (warped) next-token probabilities at the anchor and each draft.
        draft_probs: (b, k, V) the drafter's (warped) probabilities the drafts were sampled from, or None for a
            deterministic draft (one-hot q).
        generator: optional RNG for reproducible draws.

    Returns:
        accepted: (b,) drafted tokens kept; next_token: (b,) the target's token after them.
    """
    b, k = draft_ids.shape
    if k == 0:  # nothing drafted (AR): the target's own sample
        return draft_ids.new_zeros(b), torch.multinomial(target_probs[:, 0], 1, generator=generator).squeeze(1)
    p_draft = target_probs[:, :k].gather(-1, draft_ids[..., None]).squeeze(-1)  # (b, k)
    q_draft = torch.ones_like(p_draft) if draft_probs is None else draft_probs.gather(-1, draft_ids[..., None])[..., 0]
    u = torch.rand(p_draft.shape, device=p_draft.device, generator=generator)
    keep = (u * q_draft < p_draft).int()  # u < p / q, without dividing by a zero q
    accepted = keep.cumprod(dim=1).sum(dim=1)  # (b,)

    rows = torch.arange(b, device=draft_ids.device)
    p_next = target_probs[rows, accepted]  # (b, V)
    at = accepted.clamp(max=k - 1)
    if draft_probs is None:
        q_next = torch.zeros_like(p_next).scatter_(-1, draft_ids[rows, at][:, None], 1.0)
    else:
        q_next = draft_probs[rows, at].to(p_next.dtype)
    q_next = q_next * (accepted < k)[:, None]  # a fully accepted block samples from p itself
    residual = (p_next - q_next).clamp_min(0)
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_next)
    next_token = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return accepted, next_token
