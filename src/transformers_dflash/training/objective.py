"""The training objective: frozen target embedding and LM head, weighted same-position cross-entropy, accuracy.

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
    """

    def __init__(
        self, embedding: nn.Module, lm_head: nn.Linear, block_size: int, vocabulary: torch.LongTensor | None = None
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.block_size = block_size
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

    def forward(self, hidden: torch.Tensor, labels: torch.LongTensor, weights: torch.Tensor) -> ObjectiveOutput:
        """Scores drafter outputs (b, q, H) against `labels` (b, q) with per-query `weights` (b, q)."""
        b, q, _ = hidden.shape
        if self.remap is not None:
            labels = torch.where(labels >= 0, self.remap[labels.clamp_min(0)], labels)  # outside the vocab -> ignored
        weights = weights * (labels >= 0)
        keep = weights > 0  # (b, q)
        logits = F.linear(hidden[keep], self.head_weight.to(hidden.dtype), self.head_bias)  # (N, V')
        ce = F.cross_entropy(logits.float(), labels[keep], reduction="none")  # (N,)
        w = weights[keep]
        loss = (ce * w).sum() / w.sum().clamp_min(1e-8)

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
