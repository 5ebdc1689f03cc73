"""Training blocks: the block-sparse mask, same-position labels, loss weights, anchors (pure tensor code)."""

from __future__ import annotations

import math

import pytest
import torch

from transformers_dflash.training.anchors import anchor_keys, anchor_slots, draw_anchors
from transformers_dflash.training.blocks import (
    IGNORE_INDEX,
    BlockBatch,
    block_attention_mask,
    build_block_batch,
    consistent_prefix,
    default_gamma,
    labels_from_predictions,
    loss_weights,
    soft_labels_from_top_k,
)
from transformers_dflash.training.sequences import sequences_from_responses

MASK = 3


def brute_force_mask(anchors: list[int], block_size: int, context_len: int) -> torch.Tensor:
    """(q, n + q) by loops: block j sees context p < anchor_j and its own block, nothing else."""
    q = len(anchors) * block_size
    mask = torch.zeros(q, context_len + q, dtype=torch.bool)
    for j, anchor in enumerate(anchors):
        for i in range(j * block_size, (j + 1) * block_size):
            for p in range(context_len):
                mask[i, p] = p < anchor
            for other in range(q):
                mask[i, context_len + other] = other // block_size == j
    return mask


def draw(lengths: list[int], starts: list[int], block: int, num: int, seed: int = 0, epoch: int = 0, first: int = 0):
    """Anchors (b, a) and counts (b,) of rows `first ..` with these lengths and response starts."""
    lengths_t, starts_t = torch.tensor(lengths), torch.tensor(starts)
    keys = anchor_keys(seed, epoch, torch.arange(first, first + len(lengths)))
    slots = anchor_slots(lengths_t, starts_t, block, num)
    return draw_anchors(lengths_t, starts_t, keys, block, num, slots, max(lengths))


def pack(seqs, targets, anchors, block, weights=None, consistent=False, soft=None) -> BlockBatch:
    """`build_block_batch` on per-row lists (padded here, as the trainer's collate pads them)."""
    pad = lambda rows: torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # noqa: E731
    a = max(1, max(len(x) for x in anchors))
    anchor_pad = torch.stack([torch.cat([x, torch.zeros(a - len(x), dtype=torch.long)]) for x in anchors])
    num_blocks = torch.tensor([len(x) for x in anchors])
    weights = loss_weights(block) if weights is None else weights
    soft_ids, soft_logprobs = (pad([s[0] for s in soft]), pad([s[1] for s in soft])) if soft else (None, None)
    return build_block_batch(
        pad(seqs), pad(targets), anchor_pad, num_blocks, block, MASK, weights, consistent, soft_ids, soft_logprobs
    )


def reference_block_batch(input_ids, predictions, top, anchors, block_size, mask_token_id, weights, by_target):
    """The block builder the trainer used before it ran on the device (commit 8abfa4b: a loop over sequences,
    labels and soft labels shifted per sequence), kept as the oracle the vectorised builder must equal bit for bit.
    `predictions` (b, n) and `top` ((b, n, k) ids, log-probabilities) are the target's padded outputs, or None."""
    lengths = [len(ids) for ids in input_ids]
    targets = list(input_ids)
    if by_target:
        targets = [labels_from_predictions(ids, predictions[r, : lengths[r]]) for r, ids in enumerate(input_ids)]
    soft = None
    if top is not None:
        soft = [soft_labels_from_top_k(top[0][r, :length], top[1][r, :length]) for r, length in enumerate(lengths)]
    b, n = len(input_ids), max(lengths)
    a = max(1, max(anc.shape[0] for anc in anchors))
    offsets = torch.arange(block_size)  # (B,)
    anchor_pad = torch.zeros(b, a, dtype=torch.long)
    noise = torch.full((b, a, block_size), mask_token_id, dtype=torch.long)
    labels = torch.full((b, a, block_size), IGNORE_INDEX, dtype=torch.long)
    k = soft[0][0].shape[-1] if soft else 0
    soft_ids = torch.zeros(b, a, block_size, k, dtype=torch.long)
    soft_logprobs = torch.full((b, a, block_size, k), float("-inf"))
    for row, (ids, tgt, anc) in enumerate(zip(input_ids, targets, anchors, strict=True)):
        m = anc.shape[0]
        anchor_pad[row, :m] = anc
        noise[row, :m, 0] = ids[anc]
        block = anc[:, None] + offsets[None, :]  # (m, B) positions of each block
        labels[row, :m, 1:] = tgt[block[:, 1:]]  # (m, B - 1): position k predicts the token at anchor + k
        if by_target:
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


@pytest.mark.parametrize(("by_target", "top_k"), [(False, 0), (True, 0), (True, 3)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_vectorised_builder_equals_the_per_sequence_builder_bit_for_bit(by_target, top_k, block_size) -> None:
    g = torch.Generator().manual_seed(block_size + top_k)
    lengths = [90, 37, 64, block_size + 3, 120, 75]  # one row with a single candidate, padding everywhere
    starts = [10, 20, 63 - block_size, 2, 0, 30]
    for num_anchors in (1, 5, 512):
        b, n = len(lengths), max(lengths)
        ids = [torch.randint(4, 40, (length,), generator=g) for length in lengths]
        # a target that agrees with the text most of the time, so the consistent prefix cuts some blocks
        predictions = torch.randint(4, 40, (b, n), generator=g)
        for r, row in enumerate(ids):
            agree = torch.rand(len(row) - 1, generator=g) < 0.8
            predictions[r, : len(row) - 1] = torch.where(agree, row[1:], predictions[r, : len(row) - 1])
        top = None
        if top_k:
            top_ids = torch.randint(4, 40, (b, n, top_k), generator=g)
            top_ids[..., 0] = predictions
            top = (top_ids, torch.randn(b, n, top_k, generator=g).log_softmax(-1).half())  # fp16, as cached
        anchors, num_blocks = draw(lengths, starts, block_size, num_anchors, seed=num_anchors)
        per_row = [anchors[r, : num_blocks[r]] for r in range(b)]
        weights = loss_weights(block_size)
        expected = reference_block_batch(ids, predictions, top, per_row, block_size, MASK, weights, by_target)
        padded = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True)
        targets = labels_from_predictions(padded, predictions) if by_target else padded
        soft = soft_labels_from_top_k(*top) if top else (None, None)
        got = build_block_batch(padded, targets, anchors, num_blocks, block_size, MASK, weights, by_target, *soft)
        for name in BlockBatch.__dataclass_fields__:
            want, have = getattr(expected, name), getattr(got, name)
            if isinstance(want, torch.Tensor):
                assert have.dtype == want.dtype and torch.equal(have, want), name
            else:
                assert have == want, name
        assert torch.equal(got.attention_mask, expected.attention_mask)
        if by_target and num_anchors > 1:  # the consistent prefix dropped some supervised positions
            query = torch.arange(got.labels.shape[1])
            supervised = (query % block_size != 0) & (query // block_size < num_blocks[:, None])  # (b, q)
            assert (got.labels[supervised] == IGNORE_INDEX).any()


@pytest.mark.parametrize("block_size", [2, 4, 16])
def test_mask_matches_brute_force(block_size: int) -> None:
    n = 40
    anchors, _ = draw([n, n], [5, 9], block_size, 6, seed=block_size)
    a = anchors.shape[1]
    mask = block_attention_mask(anchors, block_size, n)
    assert mask.shape == (2, 1, a * block_size, n + a * block_size) and mask.dtype == torch.bool
    for row in range(2):
        assert torch.equal(mask[row, 0], brute_force_mask(anchors[row].tolist(), block_size, n))


def test_batch_labels_positions_and_weights() -> None:
    block, n = 4, 30
    ids = torch.arange(100, 100 + n)
    anchors = torch.tensor([7, 12, 20])
    weights = loss_weights(block)
    batch = pack([ids], [ids], [anchors], block, weights)
    labels = batch.labels.view(3, block)
    noise = batch.noise_ids.view(3, block)
    positions = batch.position_ids[0, n:].view(3, block)
    assert torch.equal(batch.position_ids[0, :n], torch.arange(n))
    for j, anchor in enumerate(anchors.tolist()):
        assert noise[j, 0] == ids[anchor] and (noise[j, 1:] == MASK).all()
        assert torch.equal(positions[j], torch.arange(anchor, anchor + block))
        assert labels[j, 0] == IGNORE_INDEX  # the anchor itself is not supervised
        for k in range(1, block):
            assert labels[j, k] == ids[anchor + k]  # same-position: position k predicts the token at anchor + k
    assert torch.equal(batch.weights.view(3, block), weights.expand(3, block))


def test_padded_blocks_carry_no_loss_and_see_only_themselves() -> None:
    block = 4
    seqs = [torch.arange(10, 30), torch.arange(40, 52)]
    anchors = [torch.tensor([5, 9, 14]), torch.tensor([6])]
    batch = pack(seqs, seqs, anchors, block)
    assert batch.noise_ids.shape == (2, 3 * block) and batch.attention_mask.shape == (2, 1, 12, 20 + 12)
    assert (batch.weights[1, block:] == 0).all() and (batch.labels[1, block:] == IGNORE_INDEX).all()
    assert not batch.attention_mask[1, 0, block:, :20].any()  # padded blocks see no context
    assert batch.attention_mask[..., 20:].any(dim=-1).all()  # no all-False row anywhere
    assert not batch.attention_mask[1, 0, :, 12:20].any()  # the short row never sees its padded context


@pytest.mark.parametrize(("block_size", "gamma"), [(16, 7.0), (10, 5.0), (8, 4.0)])
def test_loss_weights_formula(block_size: int, gamma: float) -> None:
    assert default_gamma(block_size) == gamma
    weights = loss_weights(block_size)
    assert weights[0] == 0
    for k in range(1, block_size):
        assert weights[k].item() == pytest.approx(math.exp(-(k - 1) / gamma))
    assert torch.allclose(loss_weights(block_size, gamma=2.0)[1:], torch.exp(-torch.arange(block_size - 1) / 2.0))


def test_anchors_are_response_tokens_with_room_for_a_block() -> None:
    block, n, start = 8, 60, 20
    for epoch in range(50):
        anchors, count = draw([n], [start], block, 10, epoch=epoch, first=3)
        anchors = anchors[0]
        assert count.tolist() == [10] and len(anchors) == 10 and len(set(anchors.tolist())) == 10
        assert (anchors >= start).all() and (anchors + block <= n).all()
        assert torch.equal(anchors, anchors.sort().values)
    anchors, count = draw([n, 25, n], [start, 20, 0], block, 1000)
    assert count.tolist() == [n - block - start + 1, 0, n - block] and anchors.shape == (3, n - block)
    assert anchors[0, : count[0]].tolist() == list(range(start, n - block + 1))  # every candidate, in order
    assert (anchors[1] == 0).all()  # a response shorter than a block: no anchor, all padding
    assert anchors[2, 0] == 1  # position 0 has no context: never an anchor


def test_anchors_are_redrawn_each_epoch_reproducible_and_independent_of_the_batch() -> None:
    def one(epoch: int, index: int, lengths=(200,), row: int = 0) -> list[int]:
        anchors, count = draw(list(lengths), [10] * len(lengths), 16, 8, seed=7, epoch=epoch, first=index - row)
        return anchors[row, : count[row]].tolist()

    assert one(0, 5) == one(0, 5)
    assert one(0, 5) != one(1, 5) and one(0, 5) != one(0, 6)
    assert one(0, 5) == one(0, 5, lengths=(90, 200, 300), row=1)  # other rows and more padding change nothing
    uniform = torch.zeros(200)
    for epoch in range(400):
        uniform[one(epoch, 0)] += 1
    assert uniform[:10].sum() == 0 and uniform[185:].sum() == 0
    assert uniform[10:185].min() >= 3 and uniform[10:185].max() <= 45  # 175 candidates, 8 of them: mean 18.3


def test_target_prediction_labels_shift_by_one() -> None:
    ids = torch.tensor([5, 6, 7, 8])
    predictions = torch.tensor([60, 70, 80, 90])  # the target's guess for the NEXT position
    assert labels_from_predictions(ids, predictions).tolist() == [5, 60, 70, 80]


def test_consistent_prefix_keeps_positions_until_the_text_leaves_the_target() -> None:
    tokens = torch.tensor([[9, 5, 6, 7, 8], [9, 5, 0, 7, 8]])
    labels = torch.tensor([[-100, 5, 6, 7, 8], [-100, 5, 6, 7, 8]])  # the target's predictions
    assert consistent_prefix(tokens, labels).tolist() == [
        [False, True, True, True, True],
        [False, True, True, False, False],  # text differs at position 2: the label at 3 follows foreign text
    ]
    assert consistent_prefix(tokens[:, :2], labels[:, :2]).tolist() == [[False, True], [False, True]]


def test_target_labels_on_foreign_text_drop_inconsistent_positions() -> None:
    ids = torch.arange(20, 40)
    targets = ids.clone()
    targets[13] = 0  # the target would not have written ids[13]: from block position 13 - anchor + 1 on, drop
    batch = pack([ids], [targets], [torch.tensor([10])], 6, consistent=True)
    assert batch.labels[0].tolist() == [IGNORE_INDEX, 31, 32, 0, IGNORE_INDEX, IGNORE_INDEX]
    assert (batch.weights[0, 4:] == 0).all() and (batch.weights[0, 1:4] > 0).all()


def test_sequences_drop_responses_shorter_than_a_block() -> None:
    rows = [
        {"id": "a", "prompt_ids": [4, 5, 6], "response_ids": list(range(10, 20))},
        {"id": "b", "prompt_ids": [4, 5, 6], "response_ids": [10, 11]},
    ]
    seqs = sequences_from_responses(rows, block_size=4)
    assert [s.id for s in seqs] == ["a"] and seqs[0].response_start == 3 and len(seqs[0].input_ids) == 13
    assert sequences_from_responses(rows, block_size=4, max_seq_len=6) == []
