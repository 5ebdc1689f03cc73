"""No per-call cost that grows with use: the pair check (and the target fingerprint it may read) runs once per
(target, drafter) pair and again only when something it read changed; repeated calls cost the same host syncs."""

import pytest
import torch
from conftest import make_drafter, make_target, random_prompt

from transformers_dflash import hub, pair_check
from transformers_dflash.engine import dflash_generate


@pytest.fixture
def recorded_pair(monkeypatch):
    """A pair whose drafter records its target's fingerprint, and a list that counts fingerprint reads."""
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    drafter.config.dflash_config["target"] = {"name_or_path": "tiny", "fingerprint": hub.target_fingerprint(target)}
    reads = []
    original = hub.target_fingerprint
    monkeypatch.setattr(pair_check, "target_fingerprint", lambda model: reads.append(1) or original(model))
    return target, drafter, reads


def test_fingerprint_is_read_once_per_pair(recorded_pair):
    target, drafter, reads = recorded_pair
    ids = random_prompt(1, 5)
    for _ in range(3):
        dflash_generate(target, drafter, ids, max_new_tokens=6)
    assert len(reads) == 1
    other = make_target("qwen3")  # same shapes, same weights: another object is checked again
    pair_check.check_pair(other, drafter)
    assert len(reads) == 2


def test_a_change_of_dtype_or_mask_is_checked_again(recorded_pair):
    target, drafter, reads = recorded_pair
    pair_check.check_pair(target, drafter)
    drafter.to(torch.float64)
    with pytest.raises(ValueError, match="use one dtype"):
        pair_check.check_pair(target, drafter)
    target.to(torch.float64)
    pair_check.check_pair(target, drafter)
    assert len(reads) == 3  # the first check, the refused one, the one after the fix; not the calls in between
    pair_check.check_pair(target, drafter)
    assert len(reads) == 3
    drafter.config.mask_token_id = target.config.eos_token_id
    with pytest.raises(ValueError, match="pad/eos token"):
        pair_check.check_pair(target, drafter)


def test_repeated_calls_cost_the_same_host_syncs(recorded_pair, monkeypatch, host_syncs):
    target, drafter, _ = recorded_pair
    ids = random_prompt(2, 6)
    syncs = host_syncs
    counts = []
    for _ in range(3):
        syncs.clear()
        dflash_generate(target, drafter, ids, max_new_tokens=12, stop_token_ids=[])
        counts.append(len(syncs))
    monkeypatch.undo()
    assert counts[1] == counts[2] and counts[0] > counts[1]  # the first call also checked the pair


def test_weights_written_in_place_are_checked_again(recorded_pair):
    target, drafter, reads = recorded_pair
    pair_check.check_pair(target, drafter)
    with torch.no_grad():
        target.get_input_embeddings().weight.mul_(1.25)  # another model's weights in the same storage
    with pytest.raises(ValueError, match="trained for"):
        pair_check.check_pair(target, drafter)
    assert len(reads) == 2
