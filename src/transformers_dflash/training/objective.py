"""The training objective: frozen target embedding and LM head, weighted same-position cross-entropy, accuracy.

With `distill > 0` the per-query loss mixes the hard-label cross-entropy with the cross-entropy against the
target's own distribution (its top-k, renormalised): `(1 - distill) * CE(label) + distill * CE(p_target)`. The soft
labels carry the target's ranking of the alternatives, many more bits per supervised token than its argmax.

The drafter has no embedding or head of its own; both are the target's, frozen and never saved. The head
(hidden x vocab) dominates a CPU training step, so the loss may use a restricted vocabulary: only the rows of the
tokens that occur in the training responses (labels outside it are dropped). Inference always uses the full head.
Only supervised queries (weight > 0: not anchors, not padding) go through the head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import IGNORE_INDEX


@dataclass
class ObjectiveOutput:
    """Loss and statistics of one batch.

    Attributes:
        loss: scalar weighted cross-entropy (sum of w * ce over supervised queries / sum of w).
        correct: (B,) argmax hits per block position (position 0 is always 0).
        total: (B,) supervised queries per block position.
        accepted: scalar sum over real blocks of the teacher-forced acceptance length (leading hits + 1).
        blocks: scalar number of real blocks.
    """

    loss: torch.Tensor
    correct: torch.Tensor
    total: torch.Tensor
    accepted: torch.Tensor
    blocks: torch.Tensor


class DraftObjective(nn.Module):
    """Embeds block tokens and scores drafter outputs with the target's frozen embedding and LM head.

    Args:
        embedding: the target's input embedding module (`get_input_embeddings()`; it may scale, as Gemma's does).
        lm_head: the target's output layer (`get_output_embeddings()`), a Linear (V, H).
        block_size: tokens per block.
        vocabulary: sorted token ids the loss is restricted to, or None for the full head.
        distill: weight of the soft-label term in [0, 1] (0: hard labels only).
    """

    def __init__(
        self,
        embedding: nn.Module,
        lm_head: nn.Linear,
        block_size: int,
        vocabulary: torch.LongTensor | None = None,
        distill: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0.0 <= distill <= 1.0:
            raise ValueError(f"distill must be in [0, 1], got {distill}.")
        self.embedding = embedding
        self.block_size, self.distill = block_size, distill
        weight, bias = lm_head.weight.detach(), None if lm_head.bias is None else lm_head.bias.detach()
        remap = None
        if vocabulary is not None:
            vocabulary = vocabulary.to(weight.device)
            weight = weight[vocabulary].clone()  # (V', H)
            bias = None if bias is None else bias[vocabulary].clone()
            remap = torch.full((lm_head.weight.shape[0],), IGNORE_INDEX, dtype=torch.long, device=weight.device)
            remap[vocabulary] = torch.arange(vocabulary.shape[0], device=weight.device)
        self.register_buffer("head_weight", weight, persistent=False)
        self.register_buffer("head_bias", bias, persistent=False)
        self.register_buffer("remap", remap, persistent=False)
        self.requires_grad_(False)

    @property
    def vocab_size(self) -> int:
        """Rows of the head the loss uses."""
        return self.head_weight.shape[0]

    @torch.no_grad()
    def embed(self, token_ids: torch.LongTensor) -> torch.Tensor:
        """(b, q) ids -> (b, q, H) frozen target embeddings."""
        return self.embedding(token_ids)

    def _remap(self, ids: torch.LongTensor) -> torch.LongTensor:
        """Token ids -> rows of the (restricted) head; ids outside it (and negative ids) -> IGNORE_INDEX."""
        if self.remap is None:
            return ids
        return torch.where(ids >= 0, self.remap[ids.clamp_min(0)], ids)

    def forward(
        self,
        hidden: torch.Tensor,
        labels: torch.LongTensor,
        weights: torch.Tensor,
        soft_ids: torch.LongTensor | None = None,
        soft_logprobs: torch.Tensor | None = None,
    ) -> ObjectiveOutput:
        """Scores drafter outputs (b, q, H) against `labels` (b, q) with per-query `weights` (b, q), and with
        `distill > 0` against the target's top-k `soft_ids` / `soft_logprobs` (b, q, k) too."""
        b, q, _ = hidden.shape
        labels = self._remap(labels)  # outside the vocab -> ignored
        weights = weights * (labels >= 0)
        keep = weights > 0  # (b, q)
        logits = F.linear(hidden[keep], self.head_weight.to(hidden.dtype), self.head_bias)  # (N, V')
        if self.distill == 0:
            per_query = F.cross_entropy(logits.float(), labels[keep], reduction="none")  # (N,)
        else:
            if soft_ids is None or soft_logprobs is None:
                raise ValueError("distill > 0 needs the target's top-k soft labels (build the batch with `soft`).")
            log_q = logits.float().log_softmax(dim=-1)  # (N, V'): one softmax serves both terms
            hard_ce = -log_q.gather(1, labels[keep][:, None])[:, 0]  # (N,)
            ids = self._remap(soft_ids[keep])  # (N, k)
            p = soft_logprobs[keep].float().exp() * (ids >= 0)  # (N, k): candidates outside the vocab dropped
            p = p / p.sum(dim=-1, keepdim=True).clamp_min(1e-8)
            soft_ce = -(p * log_q.gather(1, ids.clamp_min(0))).sum(dim=-1)  # (N,)
            per_query = (1 - self.distill) * hard_ce + self.distill * soft_ce
        w = weights[keep]
        loss = (per_query * w).sum() / w.sum().clamp_min(1e-8)

        with torch.no_grad():
            hits = torch.zeros(b, q, dtype=torch.bool, device=hidden.device)
            hits[keep] = logits.argmax(dim=-1) == labels[keep]
            position = torch.arange(q, device=hidden.device) % self.block_size  # (q,)
            correct = torch.zeros(self.block_size, device=hidden.device).index_add_(0, position, hits.sum(0).float())
            total = torch.zeros(self.block_size, device=hidden.device).index_add_(0, position, keep.sum(0).float())
            per_block = hits.view(b, -1, self.block_size)[..., 1:].int().cumprod(dim=-1).sum(-1) + 1  # (b, a)
            real = keep.view(b, -1, self.block_size).any(dim=-1)  # (b, a)
            accepted = (per_block * real).sum().float()
        return ObjectiveOutput(loss, correct, total, accepted, real.sum().float())
