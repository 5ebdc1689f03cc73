"""Plain AR on the engine's loop and static cache (`ar_generate`): equal to `target.generate`, greedy and sampled."""

import pytest
import torch
from conftest import greedy_reference, make_target, random_prompt
from test_engine import RecordingStreamer, left_padded

from transformers_dflash.ar import ar_engine_for, ar_generate


def test_greedy_equals_generate(family):
    target = make_target(family)
    for seed in range(3):
        ids = random_prompt(seed, 3 + 5 * seed)
        out = ar_generate(target, ids, max_new_tokens=20)
        assert torch.equal(out.sequences, greedy_reference(target, ids, 20))
        assert out.stats.tau == 1.0 and out.stats.steps == 19  # one token per step after the prefill's


def test_ragged_batch_with_eos_equals_generate(family):
    target = make_target(family)
    prompts = [random_prompt(s, n)[0] for s, n in [(7, 4), (8, 9), (9, 6)]]
    ids, mask = left_padded(prompts)
    target.generation_config.eos_token_id = int(greedy_reference(target, prompts[1][None], 12)[0, -4])
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    assert torch.equal(ar_generate(target, ids, mask, max_new_tokens=20).sequences, expected)
    assert (expected == target.generation_config.pad_token_id).sum() > (mask == 0).sum()  # a row stopped early


def test_sampling_with_one_seed_equals_generate():
    target = make_target("qwen3")
    ids = random_prompt(3, 6)
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 10, 0.9)]:
        torch.manual_seed(11)
        ours = ar_generate(target, ids, max_new_tokens=16, temperature=temperature, top_k=top_k, top_p=top_p)
        torch.manual_seed(11)
        theirs = target.generate(
            ids, do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=16
        )
        assert torch.equal(ours.sequences, theirs)  # the same draws from the same (tiny model's) probabilities


def test_streams_one_token_per_step_and_reuses_its_engine():
    target = make_target("llama")
    ids = random_prompt(4, 5)
    streamer = RecordingStreamer()
    out = ar_generate(target, ids, max_new_tokens=8, stop_token_ids=[], streamer=streamer)
    assert streamer.puts[0] == ids.tolist() and [len(p) for p in streamer.puts[1:]] == [1] * 8 and streamer.ended
    assert torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=8, eos_token_id=None))
    assert ar_engine_for(target) is ar_engine_for(target) and ar_engine_for(target).draft_cache is None


def test_verify_length_is_refused():
    with pytest.raises(ValueError, match="AR decoding verifies no drafts"):
        ar_engine_for(make_target("llama")).generate(random_prompt(0, 4), verify_length=2)
