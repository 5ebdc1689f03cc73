"""Unit tests of the engine's parts: the slot cache, the adaptive verify length, the token rule's settings."""

import time

import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from transformers_dflash.adaptive import StepCosts, best_width, candidate_widths, expected_tokens, measure_step_costs
from transformers_dflash.static_cache import SlotCache
from transformers_dflash.token_rule import TokenRule


def test_slot_cache_writes_each_row_at_its_own_slots():
    cache = SlotCache(num_layers=2, batch=2, kv_heads=1, head_dim=3, capacity=8, dtype=torch.float32, device="cpu")
    keys = torch.arange(2 * 3 * 3, dtype=torch.float32).view(2, 1, 3, 3)  # (b, h, t, d)
    cache.write_at(torch.tensor([[0, 1, 2], [4, 5, cache.sink]]))
    out_keys, out_values = cache.update(keys, -keys, layer_idx=1)
    assert out_keys.shape == (2, 1, 8, 3) and out_keys is cache.layers[1].keys
    assert torch.equal(out_keys[0, 0, :3], keys[0, 0]) and torch.equal(out_keys[1, 0, 4:6], keys[1, 0, :2])
    assert torch.equal(out_values[1, 0, 4:6], -keys[1, 0, :2])
    assert out_keys[0, 0, 3:].abs().sum() == 0 and out_keys[1, 0, :4].abs().sum() == 0  # nothing else touched
    assert cache.layers[0].keys.abs().sum() == 0  # other layers untouched
    assert cache.nbytes == 2 * 2 * (2 * 1 * 8 * 3) * 4
    assert cache.fits(2, 8, torch.float32, torch.device("cpu")) and not cache.fits(
        2, 9, torch.float32, torch.device("cpu")
    )


def choose_width(confidence: torch.Tensor, done: torch.Tensor, costs: dict[int, float]) -> int:
    """The width `verify_length="auto"` verifies for these drafts' chances (b, k)."""
    return best_width(expected_tokens(confidence, done), costs)[0]


def test_choose_width_follows_the_drafters_confidence():
    costs = {2: 1.0, 4: 1.2, 8: 1.6, 16: 2.4}  # seconds per step for each verify width
    done = torch.zeros(2, dtype=torch.bool)
    assert choose_width(torch.full((2, 15), 0.99), done, costs) == 16  # sure drafter: verify the whole block
    assert choose_width(torch.full((2, 15), 0.2), done, costs) == 2  # unsure drafter: verify one draft
    mixed = torch.tensor([[0.99] * 15, [0.2] * 15])
    assert choose_width(mixed, torch.tensor([False, True]), costs) == 16  # finished rows do not count
    assert choose_width(mixed, torch.tensor([True, False]), costs) == 2
    with_plain = {1: 0.9, **costs}  # width 1 verifies the anchor alone: a plain decoding step
    assert choose_width(torch.full((2, 15), 0.05), done, with_plain) == 1  # a hopeless draft is not verified
    assert choose_width(torch.full((2, 15), 0.2), done, with_plain) == 2


def test_measured_costs_grow_with_the_width():
    assert candidate_widths(16) == [1, 2, 4, 8, 16] and candidate_widths(6) == [1, 2, 4, 6]
    seconds = {2: 0.004, 4: 0.0005, 8: 0.008}  # as if a burst of load had slowed width 2 down
    draft, costs = measure_step_costs(lambda: time.sleep(0.002), lambda w: time.sleep(seconds[w]), [2, 4, 8], "cpu", 2)
    assert list(costs) == [2, 4, 8] and costs[2] == costs[4] < costs[8]  # never cheaper for more tokens
    assert 0.002 <= draft < 0.01 and 0.004 <= costs[2] < 0.02 and costs[8] >= 0.008


def test_real_step_times_correct_the_measured_costs():
    costs = StepCosts({2: 0.75, 4: 0.85, 8: 0.95, 16: 1.05}, draft=0.25, smoothing=0.5)
    assert costs.costs() == {2: 1.0, 4: 1.1, 8: 1.2, 16: 1.3}  # nothing observed yet: as measured
    assert costs.costs(drafting=False) == {2: 0.75, 4: 0.85, 8: 0.95, 16: 1.05}  # a step without a draft
    confident, running = torch.full((1, 15), 0.9), torch.zeros(1, dtype=torch.bool)
    assert choose_width(confident, running, costs.costs()) == 16
    for _ in range(8):  # in the real loop the whole block costs 4x its isolated measurement, 8 tokens as measured
        costs.observe(16, 5.2)
        costs.observe(8, 1.2)
    corrected = costs.costs()
    assert corrected[16] == pytest.approx(5.2, rel=0.01) and corrected[8] == pytest.approx(1.2, rel=0.01)
    assert corrected[4] == pytest.approx(1.1, rel=0.01)  # an unused width takes its nearest used width's factor
    assert choose_width(confident, running, corrected) == 8  # the whole block is no longer worth it
    costs.observe(4, 2.2)  # 4 tokens turn out dearer than 8: the costs stay non-decreasing in the width
    assert list(costs.costs().values()) == sorted(costs.costs().values())


def test_one_stalled_step_does_not_price_a_width_out_for_good():
    costs = StepCosts({1: 1.0, 2: 1.1, 16: 2.0}, smoothing=0.2, horizon=8)
    fair, running = torch.full((1, 15), 0.6), torch.zeros(1, dtype=torch.bool)
    for _ in range(3):  # real steps as measured
        costs.observe(1, 1.0)
        costs.observe(2, 1.1)
    assert choose_width(fair, running, costs.costs()) == 2
    costs.observe(2, 100.0)  # the host stalled for one step: it counts as at most twice the factor
    assert costs.costs()[2] == pytest.approx(1.1 * 1.2) and choose_width(fair, running, costs.costs()) == 2
    for _ in range(8):  # width 2 really is dearer now: plain steps win
        costs.observe(1, 1.0)
        costs.observe(2, 3.3)
    assert choose_width(fair, running, costs.costs()) == 1
    for _ in range(8):  # after `horizon` steps without it, width 2 is priced like its neighbour again
        assert costs.costs()[2] > 2.0
        costs.observe(1, 1.0)
    assert costs.costs()[2] == pytest.approx(1.1) and choose_width(fair, running, costs.costs()) == 2


def test_token_rule_reads_the_warpers_generate_built():
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(5), TopPLogitsWarper(0.9)])
    rule = TokenRule.from_generate(warpers, do_sample=True)
    assert (rule.temperature, rule.top_k, rule.top_p, rule.processors) == (0.7, 5, 0.9, None) and rule.do_sample
    assert TokenRule.from_generate(LogitsProcessorList(), do_sample=False).temperature == 0.0
    other = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2), TemperatureLogitsWarper(0.7)])
    rule = TokenRule.from_generate(other, do_sample=True)
    assert rule.processors is other and rule.do_sample  # applied as given, per position


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"top_p": 0.0}, "top_p"), ({"top_k": -1}, "top_k"), ({"draft": "x"}, "draft")]
)
def test_token_rule_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TokenRule(temperature=1.0, **kwargs)


def test_greedy_rule_drafts_and_accepts_by_argmax():
    rule = TokenRule()
    logits = torch.tensor([[[0.0, 5.0, 1.0], [3.0, 0.0, 1.0]]])  # (1, 2, V)
    drafts, probs = rule.propose(logits)
    assert drafts.tolist() == [[1, 0]] and probs is None
    target = torch.tensor([[[0.0, 9.0, 0.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0]]])  # argmax 1, 2, 0
    accepted, next_token = rule.accept(torch.tensor([[7, 1, 0]]), target, None)
    assert accepted.tolist() == [1] and next_token.tolist() == [2]
