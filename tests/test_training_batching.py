"""Batching: the per-epoch order (length buckets), host batches, and the prefetching thread."""

from __future__ import annotations

import pytest
import torch

from transformers_dflash.training.batching import EpochPlan, Prefetcher, collate
from transformers_dflash.training.sequences import TrainingSequence


@pytest.mark.parametrize("lengths", [None, tuple(range(30, 51))])
def test_epoch_plan_covers_each_sequence_once_per_epoch_across_processes(lengths) -> None:
    plans = [EpochPlan(21, batch_size=2, grad_accum=2, world_size=2, seed=3, lengths=lengths) for _ in range(2)]
    assert plans[0].steps_per_epoch == 2  # 8 sequences per step; the tail of 5 waits for another epoch
    seen = []
    for step in range(2):
        for rank, plan in enumerate(plans):
            epoch, micro = plan.micro_batches(step, rank)
            assert epoch == 0 and len(micro) == 2 and all(len(m) == 2 for m in micro)
            seen += [i for m in micro for i in m]
    assert len(seen) == len(set(seen)) == 16
    assert plans[0].micro_batches(2, 0)[0] == 1 and plans[0].epoch_batches(0) != plans[0].epoch_batches(1)
    assert plans[0].micro_batches(3, 1) == plans[1].micro_batches(3, 1)  # a pure function of (seed, step, rank)


def test_unbucketed_plan_slices_the_permutation() -> None:
    plan = EpochPlan(12, batch_size=3, grad_accum=1, world_size=1, seed=5, lengths=None)
    order = plan.order(1).tolist()
    assert [plan.micro_batches(4 + i, 0)[1][0] for i in range(4)] == [order[i : i + 3] for i in range(0, 12, 3)]


def test_length_buckets_cut_padding_and_still_mix_lengths() -> None:
    g = torch.Generator().manual_seed(0)
    lengths = tuple(torch.randint(40, 1000, (512,), generator=g).tolist())

    def padding(plan: EpochPlan) -> float:
        batches = plan.epoch_batches(0)
        padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
        return 1 - sum(lengths[i] for b in batches for i in b) / padded

    plain = padding(EpochPlan(512, 8, 1, 1, seed=0))
    bucketed = EpochPlan(512, 8, 1, 1, seed=0, lengths=lengths, bucket_window=16)
    assert padding(bucketed) < 0.1 < 0.3 < plain
    firsts = [max(lengths[i] for i in b) for b in bucketed.epoch_batches(0)[:16]]
    assert firsts != sorted(firsts)  # batches are shuffled after bucketing: no long-to-short sweep
    assert sorted(i for b in bucketed.epoch_batches(0) for i in b) == list(range(512))


def test_collate_pads_and_keys_each_row_by_its_index() -> None:
    seqs = [TrainingSequence(f"s{i}", torch.arange(10 + i) + 4, 3 + i) for i in range(4)]
    host = collate(seqs, [2, 0], seed=1, epoch=3, block_size=4, num_anchors=100)
    assert host.input_ids.shape == (2, 12) and host.lengths.tolist() == [12, 10]
    assert torch.equal(host.input_ids[1], torch.cat([seqs[0].input_ids, torch.zeros(2, dtype=torch.long)]))
    assert host.response_starts.tolist() == [5, 3] and host.ids == ["s2", "s0"] and host.tokens == 22
    assert host.slots == 12 - 4 - 5 + 1  # the row with the most candidates
    alone = collate(seqs, [0], seed=1, epoch=3, block_size=4, num_anchors=100)
    assert alone.keys[0] == host.keys[1] and host.keys[0] != host.keys[1]


def test_prefetcher_yields_every_step_in_order_and_raises_where_it_failed() -> None:
    made = []

    def make(step: int) -> int:
        made.append(step)
        if step == 7:
            raise RuntimeError("bad row")
        return step * 10

    assert list(Prefetcher(make, 2, 6)) == [20, 30, 40, 50]
    fetch = Prefetcher(make, 5, 9)
    got = []
    with pytest.raises(RuntimeError, match="bad row"):
        for value in fetch:
            got.append(value)
    assert got == [50, 60]
    fetch.close()
    early = Prefetcher(make, 0, 1000, depth=2)
    assert next(iter(early)) == 0
    early.close()
    assert len(made) < 100  # stopped early, not run to the end
