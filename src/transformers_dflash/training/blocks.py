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


def labels_from_predictions(input_ids: torch.LongTensor, predictions: torch.LongTensor) -> torch.LongTensor:
    """(..., n) per-position targets from the target's argmax: position p is labelled with the target's prediction at
    p - 1. The alternative to using the sequence's own tokens (which equal these for greedily regenerated responses).
    Position 0 keeps its token; it is never a label (anchors are >= 1 and carry no loss).
    """
    return torch.cat([input_ids[..., :1], predictions[..., :-1]], dim=-1)


def soft_labels_from_top_k(top_ids: torch.LongTensor, top_logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., n, k) top-k per position -> (..., n, k) soft labels per position: position p gets the target's top-k at
    p - 1 (its distribution for the token at p), as `labels_from_predictions` does for the argmax. Row 0 is never
    read."""
    shift = lambda x: torch.cat([x[..., :1, :], x[..., :-1, :]], dim=-2)  # noqa: E731
    return shift(top_ids), shift(top_logprobs)


def consistent_prefix(block_tokens: torch.LongTensor, block_labels: torch.LongTensor) -> torch.Tensor:
    """(..., B) bool: which block positions keep their label when labels are the target's argmax on foreign text.

    Position k (>= 1) of a block is labelled with the target's prediction after the sequence's tokens up to
    anchor + k - 1. That is the target's own greedy continuation only while the sequence agreed with the target
    at positions 1..k-1 of the block, so position k is kept iff `block_tokens[..., j] == block_labels[..., j]` for
    every 1 <= j < k. Position 1 is always kept; the anchor (0) never is. For responses the target regenerated
    greedily, tokens and predictions agree and every position is kept.
    """
    agree = (block_tokens[..., 1:-1] == block_labels[..., 1:-1]).int().cumprod(dim=-1).bool()  # (..., B - 2)
    edge = torch.ones(*block_tokens.shape[:-1], 1, dtype=torch.bool, device=block_tokens.device)  # (..., 1)
    return torch.cat([~edge, edge, agree], dim=-1)  # (..., B): anchor never, position 1 always, then the prefix


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
        mask: the attention mask the trainer prepared with the batch (dense or flex), or None.

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
    mask: torch.Tensor | BlockMask | None = None

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
        return BlockBatch(**{k: v if v is None or isinstance(v, int) else v.to(device) for k, v in fields.items()})


def build_block_batch(
    input_ids: torch.LongTensor,
    targets: torch.LongTensor,
    anchors: torch.LongTensor,
    num_blocks: torch.LongTensor,
    block_size: int,
    mask_token_id: int,
    weights: torch.Tensor,
    consistent: bool = False,
    soft_ids: torch.LongTensor | None = None,
    soft_logprobs: torch.Tensor | None = None,
) -> BlockBatch:
    """Packs the blocks of a batch of sequences, vectorised: a few gathers on the inputs' device, no host sync.

    Args:
        input_ids: (b, n) token ids, right-padded (the anchors' tokens are read here).
        targets: (b, n) the token each position should be predicted as: `input_ids` itself, or
            `labels_from_predictions(...)` for the target's own argmax.
        anchors: (b, a) anchor positions (`anchors.draw_anchors`), each real one <= length - block_size; padded 0.
        num_blocks: (b,) real anchors per row (the first `num_blocks[r]` columns of row r).
        block_size: tokens per block (anchor included).
        mask_token_id: the drafter's mask id (the same one inference uses).
        weights: (block_size,) per-position loss weights from `loss_weights`.
        consistent: drop positions after the first disagreement of tokens and targets (`consistent_prefix`); use
            it when `targets` are the target's predictions.
        soft_ids, soft_logprobs: (b, n, k) the target's top-k ids and log-probabilities aligned like `targets`
            (`soft_labels_from_top_k`), for distillation; None for hard labels only.

    Padded blocks (rows with fewer anchors) have anchor 0, see no context, carry no loss; padded context
    positions are never visible since every real anchor lies inside its own sequence.
    """
    (b, n), a = input_ids.shape, anchors.shape[1]
    device = input_ids.device
    offsets = torch.arange(block_size, device=device)  # (B,)
    real = torch.arange(a, device=device)[None, :] < num_blocks[:, None]  # (b, a)
    block = (anchors[:, :, None] + offsets).reshape(b, a * block_size)  # (b, q) position of each query's token
    tokens = input_ids.gather(1, block).view(b, a, block_size)  # (b, a, B)
    supervised = real[:, :, None] & (offsets > 0)  # (b, a, B): position k >= 1 of a real block
    labels = torch.where(supervised, targets.gather(1, block).view(b, a, block_size), IGNORE_INDEX)  # (b, a, B)
    if consistent:
        labels = torch.where(consistent_prefix(tokens, labels), labels, IGNORE_INDEX)
    noise = torch.where(real[:, :, None] & (offsets == 0), tokens, mask_token_id)  # (b, a, B)
    block_weights = weights.to(device)[None, None, :] * real[:, :, None] * (labels != IGNORE_INDEX)  # (b, a, B)
    position_ids = torch.cat([torch.arange(n, device=device).expand(b, n), block], dim=1)  # (b, n + q)
    soft = None
    if soft_ids is not None and soft_logprobs is not None:
        k = soft_ids.shape[-1]
        index = block[:, :, None].expand(b, a * block_size, k)  # (b, q, k)
        keep = supervised.view(b, a * block_size, 1)
        soft = (
            torch.where(keep, soft_ids.gather(1, index), 0),
            torch.where(keep, soft_logprobs.gather(1, index).float(), float("-inf")),
        )  # each (b, q, k)
    return BlockBatch(
        noise_ids=noise.reshape(b, -1),
        position_ids=position_ids,
        labels=labels.reshape(b, -1),
        weights=block_weights.reshape(b, -1),
        anchors=anchors,
        num_blocks=num_blocks,
        block_size=block_size,
        soft_ids=None if soft is None else soft[0],
        soft_logprobs=None if soft is None else soft[1],
    )


__all__ = [
    "IGNORE_INDEX",
    "PAPER_GAMMA",
    "BlockBatch",
    "block_attention_mask",
    "flex_block_mask",
    "build_block_batch",
    "consistent_prefix",
    "default_gamma",
    "labels_from_predictions",
    "loss_weights",
    "soft_labels_from_top_k",
]
