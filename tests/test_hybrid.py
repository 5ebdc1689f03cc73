"""Hybrid drafting (`lookup=True`): the n-gram index, the per-row choice, and losslessness in the engine.

Small vocabularies make tiny random targets repeat themselves, so lookup matches are frequent and both proposers
win steps; every output is compared with `target.generate`.
"""

import pytest
import torch
from conftest import make_drafter, make_forced_drafter, make_target, random_prompt

from transformers_dflash.engine import dflash_generate
from transformers_dflash.hybrid import (
    DRAFTER,
    LOOKUP,
    DraftGate,
    HybridRows,
    hybrid_proposal,
    lookup_candidates,
    lookup_proposal,
    lookup_rate,
)
from transformers_dflash.ngram_lookup import PRIOR, PRIOR_WEIGHT, NgramLookup


def test_lookup_takes_the_longest_most_recent_match():
    lookup = NgramLookup([1, 2, 3, 9, 2, 3, 4, 5, 1, 2, 3], max_n=3)
    assert lookup.propose(3) == ([9, 2, 3], 3)  # "1 2 3" continues with 9 (the 2-gram "2 3" would say 4)
    lookup.extend([7])
    assert lookup.propose(2) == ([], 0)  # 7 never occurred before
    lookup.extend([2, 3])
    assert lookup.propose(2) == ([7, 2], 2)  # "2 3" occurred three times before: the latest continues with 7
    lookup = NgramLookup([5, 6, 5, 6])
    assert lookup.propose(5) == ([5, 6, 5, 6, 5], 2)  # a loop of period 2 is extended, not cut at the context's end


def test_lookup_record_gives_the_acceptance_estimate_per_position():
    lookup = NgramLookup([1, 2, 1])
    assert (
        lookup.chances(2, 6) == list(PRIOR[1][:3]) + [PRIOR[1][3]] * 3
    )  # no evidence: the prior, positions 3+ pooled
    assert NgramLookup([1], max_n=12).chances(12, 2) == list(PRIOR[-1][:2])  # past the table: its last row
    lookup.record(2, proposed=5, accepted=5)  # all five kept: positions 0, 1, 2 and 3+ (twice) judged and right
    lookup.record(2, proposed=4, accepted=1)  # one kept, the second rejected: position 0 right, position 1 wrong
    w, prior = PRIOR_WEIGHT, PRIOR[1]
    expected = [(2 + w * prior[0]) / (2 + w), (1 + w * prior[1]) / (2 + w), (1 + w * prior[2]) / (1 + w)]
    assert lookup.chances(2, 4) == pytest.approx(expected + [(2 + w * prior[3]) / (2 + w)])
    assert lookup.chances(1, 1) == [PRIOR[0][0]]  # records are per match length
    assert PRIOR[0][0] < PRIOR[3][0] < PRIOR[7][0]  # the prior trusts longer matches more


def test_hybrid_rows_record_what_their_lookup_proposals_gained():
    rows = HybridRows([[3, 4, 3], [5, 6]])
    assert rows.commit(0, [4]) is False  # no proposal yet: nothing to record
    rows.verified([2, 0], [3, 0])  # row 0 led with 3 tokens looked up through a 2-gram; row 1 with the drafter
    assert rows.commit(0, [3, 4, 9]) is True  # two looked-up tokens accepted, the third rejected (9: the target's)
    assert rows.commit(1, [7]) is False
    assert rows.lookups[0].hits[2][:3] == [1, 1, 0] and rows.lookups[0].tries[2][:3] == [1, 1, 1]
    assert rows.lookups[0].tokens[-4:] == [4, 3, 4, 9] and rows.lookups[1].tokens == [5, 6, 7]
    rows.keep([1])  # row 0 finished and left the batch
    assert len(rows.lookups) == 1 and rows.lookups[0].tokens == [5, 6, 7] and rows.led == [(0, 0)]


def test_proposal_takes_lookup_only_where_it_is_expected_to_gain_more():
    k, vocab = 4, 10
    logits = torch.full((2, k, vocab), -9.0)
    logits[:, :, 1] = 0.0  # row 0: the drafter is sure of token 1 everywhere (p = 1 / (1 + 9 e^-9))
    logits[1, :, :] = 0.0  # row 1: a uniform drafter (p = 0.1)
    drafts = logits.argmax(dim=-1)
    lookups = [NgramLookup([3, 4, 3]), NgramLookup([3, 4, 5, 3])]  # "3" matches: [4, 3, 4, 3] and [4, 5, 3, 4]
    proposal = hybrid_proposal(logits, drafts, None, lookup_candidates(lookups, k, torch.device("cpu")))
    assert proposal.lookup_len.tolist() == [0, 4]  # row 0's drafter is sure; row 1's lookup (prior >= 0.24) beats 0.1
    assert proposal.drafts[0].tolist() == drafts[0].tolist() and proposal.drafts[1].tolist() == [4, 5, 3, 4]
    assert proposal.draft_probs is None and proposal.ngram == [1, 1]
    assert torch.allclose(proposal.confidence[1], torch.tensor(PRIOR[0]))

    draft_probs = logits.softmax(dim=-1)  # sampling: looked-up tokens are point masses, drafted ones keep q
    sampled = hybrid_proposal(logits, drafts, draft_probs, lookup_candidates(lookups, k, torch.device("cpu")))
    assert torch.equal(sampled.draft_probs[0], draft_probs[0])
    assert torch.equal(sampled.draft_probs[1], torch.eye(vocab)[[4, 5, 3, 4]])


def test_without_a_match_the_drafter_proposes():
    logits = torch.zeros(1, 3, 8)
    drafts = torch.tensor([[2, 2, 2]])
    candidates = lookup_candidates([NgramLookup([1, 2, 3])], 3, torch.device("cpu"))
    proposal = hybrid_proposal(logits, drafts, None, candidates)
    assert proposal.lookup_len.tolist() == [0] and torch.equal(proposal.drafts, drafts) and proposal.ngram == [0]


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
@pytest.mark.parametrize("verify_length", [None, "auto"])
def test_hybrid_greedy_equals_generate(family, block_size, verify_length):
    for seed in range(3):
        target = make_target(family, vocab_size=12, seed=seed)
        ids = random_prompt(seed, 10, 12)
        expected = target.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
        drafter = make_drafter(target, block_size=block_size)
        out = dflash_generate(
            target, drafter, ids, max_new_tokens=40, stop_token_ids=[], verify_length=verify_length, lookup=True
        )
        assert torch.equal(out.sequences, expected)
        assert sum(len(row) for row in out.stats.proposers) == out.stats.steps  # batch 1: one proposer per step


def test_hybrid_lookup_wins_steps_and_accepts_long_runs():
    target = make_target("qwen3", vocab_size=12, seed=2)  # its greedy output falls into a "2 0" loop
    ids = random_prompt(2, 10, 12)
    expected = target.generate(ids, do_sample=False, max_new_tokens=60, eos_token_id=None)
    out = dflash_generate(target, make_drafter(target, block_size=8), ids, max_new_tokens=60, stop_token_ids=[],
                          lookup=True)  # fmt: skip
    assert torch.equal(out.sequences, expected)
    share = out.stats.proposer_share
    assert set(share) == {DRAFTER, LOOKUP} and share[LOOKUP] > 0.5
    won = [n for n, who in zip(out.stats.accept_lengths[0], out.stats.proposers[0], strict=True) if who == LOOKUP]
    assert max(won) >= 4  # the random drafter never gets a draft right; looked-up loops do


def test_hybrid_batch_with_eos_mid_block_equals_batched_generate(family):
    target = make_target(family, vocab_size=12, seed=1)
    prompts = [random_prompt(s, n, 12) for s, n in ((1, 9), (2, 5), (3, 12))]
    eos = 4  # frequent in these outputs: rows stop at different steps, often inside a block
    alone = [
        target.generate(p, do_sample=False, max_new_tokens=30, eos_token_id=eos, pad_token_id=0)[0] for p in prompts
    ]
    assert sum(eos in a[p.shape[1] :].tolist() for a, p in zip(alone, prompts, strict=True)) >= 2
    width = max(p.shape[1] for p in prompts)
    ids = torch.cat([torch.nn.functional.pad(p, (width - p.shape[1], 0)) for p in prompts])
    mask = torch.cat([torch.nn.functional.pad(torch.ones_like(p), (width - p.shape[1], 0)) for p in prompts])
    drafter = make_forced_drafter(target, [a.tolist() for a in alone], block_size=8)  # right up to a random point
    out = dflash_generate(
        target, drafter, ids, attention_mask=mask, max_new_tokens=30, stop_token_ids=[eos], lookup=True,
        verify_length="auto",
    )  # fmt: skip
    for r, (prompt, reference) in enumerate(zip(prompts, alone, strict=True)):
        new = reference[prompt.shape[1] :].tolist()
        assert out.sequences[r, width : width + len(new)].tolist() == new
        assert (out.sequences[r, width + len(new) :] == 0).all()  # padded after the row's end


def test_hybrid_max_new_tokens_cuts_exactly():
    target = make_target("qwen3", vocab_size=12, seed=2)
    ids = random_prompt(2, 10, 12)
    for max_new_tokens in (1, 2, 5, 17):
        expected = target.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None)
        out = dflash_generate(target, make_drafter(target, block_size=8), ids, max_new_tokens=max_new_tokens,
                              stop_token_ids=[], lookup=True)  # fmt: skip
        assert torch.equal(out.sequences, expected)


def test_lookup_alone_proposes_its_continuation_and_fillers_at_chance_zero():
    lookups = [NgramLookup([3, 4, 3]), NgramLookup([1, 2])]  # row 0: "3" -> [4, 3, 4]; row 1: no match
    for _ in range(8):
        lookups[0].record(1, proposed=4, accepted=4)  # a record that trusts row 0's 1-gram matches
    chances = lookups[0].chances(1, 3)
    assert chances[0] > 0.7
    candidates = lookup_candidates(lookups, 3, torch.device("cpu"))
    proposal = lookup_proposal(candidates)
    assert proposal.drafts.tolist() == [[4, 3, 4], [0, 0, 0]] and proposal.draft_probs is None
    assert torch.allclose(proposal.confidence, torch.tensor([chances, [0.0] * 3]))
    costs = {1: 1.0, 2: 1.5, 4: 2.0}  # seconds of a step without a draft, by verify width
    kept = [chances[0], chances[0] * chances[1], chances[0] * chances[1] * chances[2]]
    expected = {w: 1 + 1 + sum(kept[: w - 1]) for w in costs}  # row 0 gains, row 1 takes a plain step
    assert lookup_rate(candidates, [False, False], costs) == pytest.approx(max(expected[w] / costs[w] for w in costs))
    assert lookup_rate(candidates, [False, True], costs) == pytest.approx((expected[4] - 1) / 2.0)  # row 1 done


def test_draft_gate_skips_the_drafter_only_when_lookup_is_worth_more_and_explores():
    gate = DraftGate(explore_every=3, max_explore_every=6)
    assert gate.should_draft(lookup_rate=100.0)  # no estimate yet: draft
    gate.record(True, rate=10.0)  # it lost to lookup (100): the next exploration waits twice as long
    assert gate.interval == 6
    assert gate.should_draft(lookup_rate=9.0) and not gate.should_draft(lookup_rate=11.0)
    for _ in range(5):
        gate.record(False)
    assert gate.should_draft(lookup_rate=11.0)  # five steps without a draft: the sixth one drafts
    gate.record(True, rate=20.0)  # and wins: the interval is back to 3
    assert gate.draft_rate == pytest.approx(15.0) and gate.skipped == 0 and gate.interval == 3


@pytest.mark.parametrize("block_size", [4, 16])
def test_steps_without_a_draft_stay_lossless(family, block_size, monkeypatch):
    """A gate that drafts only when it must (first step, then now and then): the skipped steps' target features wait
    in the context for the next draft step, rows without a match take plain steps, and the output is the target's."""

    def must(self: DraftGate, lookup_rate: float) -> bool:
        return self.draft_rate is None or self.skipped + 1 >= self.interval

    monkeypatch.setattr(DraftGate, "should_draft", must)
    for seed in range(2):
        target = make_target(family, vocab_size=12, seed=seed)
        ids = random_prompt(seed, 10, 12)
        expected = target.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
        drafter = make_drafter(target, block_size=block_size)
        out = dflash_generate(
            target, drafter, ids, max_new_tokens=40, stop_token_ids=[], verify_length="auto", lookup=True
        )
        assert torch.equal(out.sequences, expected)
        assert 0 < out.stats.draft_steps < out.stats.steps  # some steps drafted, some did not
