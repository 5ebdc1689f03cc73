"""Training blocks: the block-sparse mask, same-position labels, loss weights, anchors (pure tensor code)."""

from __future__ import annotations

import math

import pytest
import torch

from transformers_dflash.training.blocks import (
    IGNORE_INDEX,
    anchor_generator,
    block_attention_mask,
    build_block_batch,
    consistent_prefix,
    default_gamma,
    labels_from_predictions,
    loss_weights,
    sample_anchors,
)
from transformers_dflash.training.sequences import EpochPlan, sequences_from_responses

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


@pytest.mark.parametrize("block_size", [2, 4, 16])
def test_mask_matches_brute_force(block_size: int) -> None:
    g = torch.Generator().manual_seed(block_size)
    n = 40
    rows = [sample_anchors(n, 5, block_size, 6, g), sample_anchors(n, 9, block_size, 6, g)]
    a = max(len(r) for r in rows)
    anchors = torch.stack([torch.cat([r, torch.zeros(a - len(r), dtype=torch.long)]) for r in rows])
    mask = block_attention_mask(anchors, block_size, n)
    assert mask.shape == (2, 1, a * block_size, n + a * block_size) and mask.dtype == torch.bool
    for row in range(2):
        assert torch.equal(mask[row, 0], brute_force_mask(anchors[row].tolist(), block_size, n))


def test_batch_labels_positions_and_weights() -> None:
    block, n = 4, 30
    ids = torch.arange(100, 100 + n)
    anchors = torch.tensor([7, 12, 20])
    weights = loss_weights(block)
    batch = build_block_batch([ids], [ids], [anchors], block, MASK, weights)
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
    batch = build_block_batch(seqs, seqs, anchors, block, MASK, loss_weights(block))
    assert batch.noise_ids.shape == (2, 3 * block) and batch.attention_mask.shape == (2, 1, 12, 20 + 12)
    assert (batch.weights[1, block:] == 0).all() and (batch.labels[1, block:] == IGNORE_INDEX).all()
    assert not batch.attention_mask[1, 0, block:, :20].any()  # padded blocks see no context
    assert batch.attention_mask[..., 20:].any(dim=-1).all()  # no all-False row anywhere
    assert not batch.attention_mask[1, 0, :, 12:20].any()  # the short row never sees its padded context


def test_blocks_never_run_past_the_end() -> None:
    ids = torch.arange(10)
    with pytest.raises(ValueError, match="past the sequence end"):
        build_block_batch([ids], [ids], [torch.tensor([7])], 4, MASK, loss_weights(4))


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
    for seed in range(50):
        anchors = sample_anchors(n, start, block, 10, anchor_generator(0, seed, 3))
        assert len(anchors) == 10 and len(set(anchors.tolist())) == 10
        assert (anchors >= start).all() and (anchors + block <= n).all()
        assert torch.equal(anchors, anchors.sort().values)
    assert len(sample_anchors(n, start, block, 1000, anchor_generator(0, 0, 0))) == n - block - start + 1
    assert len(sample_anchors(25, 20, block, 4, anchor_generator(0, 0, 0))) == 0  # response shorter than a block


def test_anchors_are_redrawn_each_epoch_and_reproducible() -> None:
    draw = lambda epoch, index: sample_anchors(200, 10, 16, 8, anchor_generator(7, epoch, index)).tolist()  # noqa: E731
    assert draw(0, 5) == draw(0, 5)
    assert draw(0, 5) != draw(1, 5) and draw(0, 5) != draw(0, 6)


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
    batch = build_block_batch([ids], [targets], [torch.tensor([10])], 6, MASK, loss_weights(6), consistent=True)
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


def test_epoch_plan_covers_each_sequence_once_per_epoch_across_processes() -> None:
    plans = [EpochPlan(21, batch_size=2, grad_accum=2, world_size=2, seed=3) for _ in range(2)]
    assert plans[0].steps_per_epoch == 2  # 8 sequences per step; the tail of 5 waits for another epoch
    seen = []
    for step in range(2):
        for rank, plan in enumerate(plans):
            epoch, micro = plan.micro_batches(step, rank)
            assert epoch == 0 and len(micro) == 2 and all(len(m) == 2 for m in micro)
            seen += [i for m in micro for i in m]
    assert len(seen) == len(set(seen)) == 16
    assert plans[0].micro_batches(2, 0)[0] == 1 and plans[0].order(0).tolist() != plans[0].order(1).tolist()
