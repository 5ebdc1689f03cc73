"""Training blocks: anchors, the block-sparse attention mask, same-position labels and loss weights.

Pure tensor code. One training forward packs every block of a sequence: the drafter's queries are the
concatenation of all blocks `[anchor token, MASK x (B - 1)]` (q = num_blocks * B), its context is the target
features of the whole sequence (n tokens), and the mask lets block j see the context keys strictly before its
anchor (`kv_pos < anchor_j`, exactly what inference sees: the anchor is the last verified token, whose features
the target has not computed yet), its own block bidirectionally, and no other block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

IGNORE_INDEX = -100
# The paper's loss-weight decay per block size: w_k = exp(-(k - 1) / gamma).
PAPER_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    """The paper's gamma for 16, 10 and 8-token blocks; `block_size / 2` for other sizes."""
    return PAPER_GAMMA.get(block_size, block_size / 2)


def loss_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """(B,) weight of each block position: 0 for the anchor (k = 0), `exp(-(k - 1) / gamma)` for k >= 1."""
    gamma = default_gamma(block_size) if gamma is None else gamma
    if gamma <= 0:
        raise ValueError(f"gamma must be > 0, got {gamma}.")
    k = torch.arange(block_size, dtype=torch.float32)
    return torch.where(k == 0, torch.zeros(()), torch.exp(-(k - 1) / gamma))


def anchor_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The RNG that draws the anchors of sequence `index` in `epoch`: independent of data order and process rank,
    so anchors are redrawn every epoch and a resumed run draws exactly what an uninterrupted one would."""
    state = np.random.SeedSequence([seed, epoch, index]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def sample_anchors(
    seq_len: int, response_start: int, block_size: int, num_anchors: int, generator: torch.Generator
) -> torch.LongTensor:
    """Sorted random anchor positions, without repetition, for one sequence.

    An anchor is a response token (position >= `response_start`, and >= 1 so some context exists) whose whole block
    `anchor .. anchor + block_size - 1` lies inside the sequence. Returns (a,) with a = min(num_anchors, candidates),
    possibly 0 (response shorter than a block).
    """
    first, last = max(response_start, 1), seq_len - block_size  # inclusive range of valid anchors
    candidates = last - first + 1
    if candidates <= 0 or num_anchors <= 0:
        return torch.zeros(0, dtype=torch.long)
    picked = torch.randperm(candidates, generator=generator)[: min(num_anchors, candidates)]
    return (picked + first).sort().values


def labels_from_predictions(input_ids: torch.LongTensor, predictions: torch.LongTensor) -> torch.LongTensor:
    """(n,) per-position targets from the target's argmax: position p is labelled with the target's prediction at p - 1.

    The alternative to using the sequence's own tokens (which equal these for greedily regenerated responses).
    Position 0 keeps its token; it is never a label (anchors are >= 1 and carry no loss).
    """
    return torch.cat([input_ids[:1], predictions[:-1]])


def soft_labels_from_top_k(top_ids: torch.LongTensor, top_logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, k) top-k per position -> (n, k) soft labels per position: position p gets the target's top-k at p - 1
    (its distribution for the token at p), as `labels_from_predictions` does for the argmax. Row 0 is never read."""
    return torch.cat([top_ids[:1], top_ids[:-1]]), torch.cat([top_logprobs[:1], top_logprobs[:-1]])


def consistent_prefix(block_tokens: torch.LongTensor, block_labels: torch.LongTensor) -> torch.Tensor:
    """(m, B) bool: which block positions keep their label when labels are the target's argmax on foreign text.

    Position k (>= 1) of a block is labelled with the target's prediction after the sequence's tokens up to
    anchor + k - 1. That is the target's own greedy continuation only while the sequence agreed with the target
    at positions 1..k-1 of the block, so position k is kept iff `block_tokens[:, j] == block_labels[:, j]` for
    every 1 <= j < k. Position 1 is always kept; the anchor (0) never is. For responses the target regenerated
    greedily, tokens and predictions agree and every position is kept.
    """
    agree = (block_tokens[:, 1:-1] == block_labels[:, 1:-1]).int().cumprod(dim=1).bool()  # (m, B - 2)
    edge = torch.ones(block_tokens.shape[0], 1, dtype=torch.bool, device=block_tokens.device)  # (m, 1)
    return torch.cat([~edge, edge, agree], dim=1)  # (m, B): anchor never, position 1 always, then the prefix


def block_attention_mask(anchors: torch.LongTensor, block_size: int, context_len: int) -> torch.Tensor:
    """The packed-blocks mask (b, 1, q, n + q), bool, True = attend, with q = a * block_size and n = `context_len`.

    `anchors` is (b, a). Query i belongs to block j = i // block_size and sees context key p iff p < anchors[:, j]
    and block key i' iff i' // block_size == j. Every row sees at least its own block, so no row is all False.
    """
    b, a = anchors.shape
    q = a * block_size
    block_of = torch.arange(q, device=anchors.device) // block_size  # (q,)
    query_anchor = anchors[:, block_of]  # (b, q)
    context = torch.arange(context_len, device=anchors.device)[None, None, :] < query_anchor[:, :, None]  # (b, q, n)
    own_block = (block_of[:, None] == block_of[None, :]).expand(b, q, q)  # (b, q, q)
    return torch.cat([context, own_block], dim=-1)[:, None]  # (b, 1, q, n + q)


def flex_block_mask(anchors: torch.LongTensor, block_size: int, context_len: int) -> BlockMask:
    """The mask of [`block_attention_mask`] as a flex attention `BlockMask` (b, heads shared, q, n + q).

    Only the tiles a block can see are computed, instead of the dense (q, n + q) mask: on a GPU with the paper's
    512 blocks of 16 per sequence that is most of the attention cost saved.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    b, a = anchors.shape
    q = a * block_size

    def visible(row: torch.Tensor, head: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        block = query // block_size
        return torch.where(key < context_len, key < anchors[row, block], (key - context_len) // block_size == block)

    return create_block_mask(visible, b, None, q, context_len + q, device=anchors.device)


@dataclass
class BlockBatch:
    """Everything the packed training forward needs besides the target features.

    Attributes:
        noise_ids: (b, q) `[anchor token, MASK x (B - 1)]` per block; padded blocks are all MASK.
        position_ids: (b, n + q) context positions 0..n-1, then each block's anchor..anchor + B - 1.
        labels: (b, q) token each query predicts (the token at anchor + k); IGNORE_INDEX at anchors and padding.
        weights: (b, q) loss weight of each query; 0 at anchors and padding.
        anchors: (b, a) anchor positions (0 for padded blocks).
        num_blocks: (b,) real blocks per row.
        block_size: tokens per block (anchor included).
        soft_ids: (b, q, k) the target's top-k candidates for each query's token (distillation), or None.
        soft_logprobs: (b, q, k) their log-probabilities, or None.

    The attention mask is built from the anchors when asked for, dense or as a flex `BlockMask`: a trainer that
    uses one never builds (nor moves to its device) the other.
    """

    noise_ids: torch.LongTensor
    position_ids: torch.LongTensor
    labels: torch.LongTensor
    weights: torch.Tensor
    anchors: torch.LongTensor
    num_blocks: torch.LongTensor
    block_size: int
    soft_ids: torch.LongTensor | None = None
    soft_logprobs: torch.Tensor | None = None

    @property
    def context_len(self) -> int:
        """n: context positions before the packed blocks."""
        return self.position_ids.shape[1] - self.noise_ids.shape[1]

    @property
    def attention_mask(self) -> torch.Tensor:
        """(b, 1, q, n + q) bool block-sparse mask (see `block_attention_mask`)."""
        return block_attention_mask(self.anchors, self.block_size, self.context_len)

    def flex_mask(self) -> BlockMask:
        """The same mask as a flex attention `BlockMask` (see `flex_block_mask`)."""
        return flex_block_mask(self.anchors, self.block_size, self.context_len)

    def to(self, device: torch.device | str) -> BlockBatch:
        """A copy with every tensor on `device`."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return BlockBatch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in fields.items()})


def build_block_batch(
    input_ids: list[torch.LongTensor],
    targets: list[torch.LongTensor],
    anchors: list[torch.LongTensor],
    block_size: int,
    mask_token_id: int,
    weights: torch.Tensor,
    consistent: bool = False,
    soft: list[tuple[torch.LongTensor, torch.Tensor]] | None = None,
) -> BlockBatch:
    """Packs the blocks of several sequences into one batch (context padded to the longest sequence).

    Args:
        input_ids: per sequence (n_i,) token ids (the anchors' tokens are read here).
        targets: per sequence (n_i,) the token each position should be predicted as: `input_ids` itself, or
            `labels_from_predictions(...)` for the target's own argmax.
        anchors: per sequence (a_i,) anchor positions from `sample_anchors` (each <= n_i - block_size).
        block_size: tokens per block (anchor included).
        mask_token_id: the drafter's mask id (the same one inference uses).
        weights: (block_size,) per-position loss weights from `loss_weights`.
        consistent: drop positions after the first disagreement of tokens and targets (`consistent_prefix`); use
            it when `targets` are the target's predictions.
        soft: per sequence (n_i, k) top-k ids and log-probabilities aligned like `targets`
            (`soft_labels_from_top_k`), for distillation; None for hard labels only.

    Padded blocks (rows with fewer anchors) have anchor 0, see no context, carry no loss; padded context
    positions are never visible since every real anchor lies inside its own sequence.
    """
    b = len(input_ids)
    n = max(ids.shape[0] for ids in input_ids)
    a = max(1, max(anc.shape[0] for anc in anchors))
    offsets = torch.arange(block_size)  # (B,)
    anchor_pad = torch.zeros(b, a, dtype=torch.long)
    noise = torch.full((b, a, block_size), mask_token_id, dtype=torch.long)
    labels = torch.full((b, a, block_size), IGNORE_INDEX, dtype=torch.long)
    k = soft[0][0].shape[-1] if soft else 0
    soft_ids = torch.zeros(b, a, block_size, k, dtype=torch.long)
    soft_logprobs = torch.full((b, a, block_size, k), float("-inf"))
    for row, (ids, tgt, anc) in enumerate(zip(input_ids, targets, anchors, strict=True)):
        if anc.numel() and int(anc.max()) + block_size > ids.shape[0]:
            raise ValueError(
                f"Anchor {int(anc.max())} + block {block_size} runs past the sequence end {ids.shape[0]}."
            )
        m = anc.shape[0]
        anchor_pad[row, :m] = anc
        noise[row, :m, 0] = ids[anc]
        block = anc[:, None] + offsets[None, :]  # (m, B) positions of each block
        labels[row, :m, 1:] = tgt[block[:, 1:]]  # (m, B - 1): position k predicts the token at anchor + k
        if consistent:
            labels[row, :m][~consistent_prefix(ids[block], labels[row, :m])] = IGNORE_INDEX
        if soft:
            soft_ids[row, :m, 1:] = soft[row][0][block[:, 1:]]  # (m, B - 1, k)
            soft_logprobs[row, :m, 1:] = soft[row][1][block[:, 1:]].float()
    num_blocks = torch.tensor([anc.shape[0] for anc in anchors])
    real = torch.arange(a)[None, :] < num_blocks[:, None]  # (b, a)
    block_weights = weights[None, None, :] * real[:, :, None] * (labels != IGNORE_INDEX)  # (b, a, B)
    block_positions = (anchor_pad[:, :, None] + offsets).reshape(b, a * block_size)  # (b, q)
    position_ids = torch.cat([torch.arange(n).expand(b, n), block_positions], dim=1)  # (b, n + q)
    return BlockBatch(
        noise_ids=noise.reshape(b, -1),
        position_ids=position_ids,
        labels=labels.reshape(b, -1),
        weights=block_weights.reshape(b, -1),
        anchors=anchor_pad,
        num_blocks=num_blocks,
        block_size=block_size,
        soft_ids=soft_ids.reshape(b, a * block_size, k) if soft else None,
        soft_logprobs=soft_logprobs.reshape(b, a * block_size, k) if soft else None,
    )


__all__ = [
    "IGNORE_INDEX",
    "PAPER_GAMMA",
    "BlockBatch",
    "anchor_generator",
    "block_attention_mask",
    "flex_block_mask",
    "build_block_batch",
    "consistent_prefix",
    "default_gamma",
    "labels_from_predictions",
    "loss_weights",
    "sample_anchors",
    "soft_labels_from_top_k",
]
