"""The fast engine (greedy): lossless vs `target.generate`, batching, stops, streaming, reuse, custom_generate, errors."""

import os

import pytest
import torch
from conftest import (
    EOS,
    greedy_reference,
    make_drafter,
    make_forced_drafter,
    make_target,
    random_prompt,
)
from transformers.generation.streamers import BaseStreamer

from transformers_dflash import DFlashConfig, DFlashDraftModel
from transformers_dflash.custom_generate import fast_generate
from transformers_dflash.engine import DFlashEngine, dflash_generate, engine_for

FORCED = dict(vocab_size=48, hidden_size=64)  # the forced drafter needs vocab <= hidden


class RecordingStreamer(BaseStreamer):
    """Keeps every `put` (as lists) and whether `end` was called."""

    def __init__(self) -> None:
        self.puts: list[list] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.tolist())

    def end(self) -> None:
        self.ended = True


def left_padded(prompts: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, P) ids and mask of 1D prompts, left-padded."""
    width = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat([torch.full((width - len(p),), pad), p]) for p in prompts])
    mask = torch.stack([torch.cat([torch.zeros(width - len(p)), torch.ones(len(p))]) for p in prompts]).long()
    return ids, mask


def full_reference(target, ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy `generate` that ignores eos: exactly `max_new_tokens` new tokens."""
    return target.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None)


def forced_pair(family: str, ids: torch.Tensor, max_new_tokens: int, block_size: int = 4, **kw):
    """A (48-vocab) target, its eos-free greedy reference for `ids` (1, P), and a forced drafter that knows it."""
    target = make_target(family, **FORCED)
    expected = full_reference(target, ids, max_new_tokens)
    return target, expected, make_forced_drafter(target, [expected[0].tolist()], block_size=block_size, **kw)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_greedy_equals_generate_with_random_drafter(family, tie):
    target = make_target(family, tie=tie, gqa=not tie)
    drafter = make_drafter(target, block_size=4)
    for seed in range(3):
        ids = random_prompt(seed, 3 + 5 * seed)
        out = dflash_generate(target, drafter, ids, max_new_tokens=24)
        assert torch.equal(out.sequences, greedy_reference(target, ids, 24))


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_forced_acceptance_is_lossless_and_accepts(family, block_size):
    ids = random_prompt(block_size, 6, 48)
    target, expected, drafter = forced_pair(family, ids, 40, block_size=block_size, seed=block_size)
    out = dflash_generate(target, drafter, ids, max_new_tokens=40, stop_token_ids=[])
    assert torch.equal(out.sequences, expected)
    assert max(out.stats.accept_lengths[0]) > 1  # drafts were accepted, not just the target's own token


def test_full_blocks_are_accepted_whole(family):
    ids = random_prompt(3, 5, 48)
    target, expected, drafter = forced_pair(family, ids, 33, block_size=8, accept_all=True)
    out = dflash_generate(target, drafter, ids, max_new_tokens=33, stop_token_ids=[])
    assert torch.equal(out.sequences, expected)
    assert out.stats.accept_lengths[0] == [8, 8, 8, 8]  # 1 prefill token + 4 full blocks of 8 = 33
    assert out.stats.tau == 8.0 and out.stats.histogram[8] == 4


def test_ragged_batch_rows_equal_their_prompt_alone(family):
    target = make_target(family, **FORCED)
    prompts = [random_prompt(s, n, 48)[0] for s, n in [(1, 5), (2, 11), (3, 2), (4, 7)]]
    references = [full_reference(target, p[None], 30)[0] for p in prompts]
    drafter = make_forced_drafter(target, [r.tolist() for r in references], block_size=4, seed=5)
    ids, mask = left_padded(prompts)
    out = dflash_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=30, stop_token_ids=[])
    for row, (prompt, reference) in enumerate(zip(prompts, references, strict=True)):
        pad = ids.shape[1] - len(prompt)
        assert out.sequences[row, pad:].tolist() == reference.tolist()
    accepted = [sum(lengths) for lengths in out.stats.accept_lengths]
    assert accepted == [29] * 4 and len({tuple(a) for a in out.stats.accept_lengths}) > 1  # rows advanced unevenly


def test_batch_equals_batched_generate_with_eos(family):
    target = make_target(family)
    drafter = make_drafter(target, block_size=4)
    prompts = [random_prompt(s, n)[0] for s, n in [(7, 4), (8, 9), (9, 6)]]
    ids, mask = left_padded(prompts)
    target.generation_config.eos_token_id = int(greedy_reference(target, prompts[1][None], 12)[0, -4])
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    out = dflash_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=20)
    assert torch.equal(out.sequences, expected)
    assert (expected == target.generation_config.pad_token_id).sum() > (mask == 0).sum()  # a row stopped early
    assert engine_for(target, drafter).target_cache.layers[0].keys.shape[0] < 3  # and left the batch


def test_stop_token_inside_an_accepted_block(family):
    ids = random_prompt(4, 6, 48)
    target, expected, drafter = forced_pair(family, ids, 30, block_size=8, accept_all=True)
    new = expected[0, ids.shape[1] :].tolist()
    stop = next(t for i, t in enumerate(new) if i >= 3 and i % 8 not in (0, 7) and t not in new[:i])  # mid-block
    out = dflash_generate(target, drafter, ids, max_new_tokens=30, stop_token_ids=[stop])
    cut = ids.shape[1] + new.index(stop) + 1
    assert torch.equal(out.sequences, expected[:, :cut])
    assert torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=stop))


@pytest.mark.parametrize("max_new_tokens", range(1, 6))
def test_max_new_tokens_cuts_exactly(max_new_tokens):
    ids = random_prompt(5, 6, 48)
    target, expected, drafter = forced_pair("llama", ids, 12, block_size=4, accept_all=True)
    out = dflash_generate(target, drafter, ids, max_new_tokens=max_new_tokens, stop_token_ids=[])
    assert torch.equal(out.sequences, expected[:, : ids.shape[1] + max_new_tokens])


def test_generated_mask_token_is_kept(family):
    ids = random_prompt(6, 5, 48)
    target = make_target(family, **FORCED)
    expected = greedy_reference(target, ids, 20)
    mask_id = next(t for t in expected[0, ids.shape[1] :].tolist() if t > 3)  # a token the target generates
    base = make_drafter(target, block_size=4)
    config = DFlashConfig.from_config(base.config)
    config.mask_token_id = config.dflash_config["mask_token_id"] = mask_id
    torch.manual_seed(1)
    drafter = DFlashDraftModel(config).eval()
    out = dflash_generate(target, drafter, ids, max_new_tokens=20)
    assert torch.equal(out.sequences, expected) and (out.sequences[0, ids.shape[1] :] == mask_id).any()


def test_streamer_receives_the_prompt_then_each_step(family):
    ids = random_prompt(7, 5, 48)
    target, expected, drafter = forced_pair(family, ids, 25, block_size=4, seed=3)
    streamer = RecordingStreamer()
    out = dflash_generate(target, drafter, ids, max_new_tokens=25, stop_token_ids=[], streamer=streamer)
    assert streamer.puts[0] == ids.tolist() and streamer.ended
    streamed = [t for chunk in streamer.puts[1:] for t in chunk]
    assert streamed == out.sequences[0, ids.shape[1] :].tolist()
    assert [len(c) for c in streamer.puts[2:]] == out.stats.accept_lengths[0]  # one put per committed step


def test_reused_engine_and_cache_give_the_same_result():
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    short, long = random_prompt(8, 4), random_prompt(9, 12)
    first = dflash_generate(target, drafter, short, max_new_tokens=20).sequences
    engine = engine_for(target, drafter)
    cache = engine.target_cache
    assert torch.equal(
        dflash_generate(target, drafter, long, max_new_tokens=10).sequences, greedy_reference(target, long, 10)
    )
    assert engine_for(target, drafter) is engine and engine.target_cache is cache  # reused, not reallocated
    assert torch.equal(dflash_generate(target, drafter, short, max_new_tokens=20).sequences, first)
    assert torch.equal(first, greedy_reference(target, short, 20))


def test_stats_describe_the_call():
    ids = random_prompt(10, 6, 48)
    target, expected, drafter = forced_pair("llama", ids, 30, block_size=4, seed=2)
    out = dflash_generate(target, drafter, ids, max_new_tokens=30, stop_token_ids=[])
    stats, lengths = out.stats, out.stats.accept_lengths[0]
    assert stats.tau == pytest.approx(sum(lengths) / len(lengths)) and sum(stats.histogram) == len(lengths)
    assert stats.new_tokens == 30 == 1 + sum(lengths) and stats.steps == len(lengths)
    assert 0 < stats.draft_s + stats.verify_s + stats.prefill_s <= stats.total_s and stats.tokens_per_second > 0
    engine = engine_for(target, drafter)
    assert stats.cache_bytes == engine.target_cache.nbytes + engine.draft_cache.nbytes > 0
    assert engine.target_cache.capacity == ids.shape[1] + 30 + 4 + 1  # prompt + new + block + sink, fixed
    assert dflash_generate(target, drafter, ids, max_new_tokens=30, return_stats=False).stats is None


@pytest.mark.parametrize("verify_length", [1, 2, "auto"])
def test_verify_length_stays_lossless(verify_length):
    ids = random_prompt(11, 6, 48)
    target, expected, drafter = forced_pair("qwen3", ids, 30, block_size=8, seed=4)
    out = dflash_generate(target, drafter, ids, max_new_tokens=30, stop_token_ids=[], verify_length=verify_length)
    assert torch.equal(out.sequences, expected)
    widths = set(out.stats.verify_widths)
    assert widths == {verify_length + 1} if verify_length != "auto" else widths <= {2, 4, 8}
    assert max(out.stats.accept_lengths[0]) <= max(widths)


def test_custom_generate_equals_generate(family):
    target = make_target(family, **FORCED)
    prompts = [random_prompt(s, n, 48)[0] for s, n in [(12, 4), (13, 8)]]
    ids, mask = left_padded(prompts)
    drafter = make_drafter(target, block_size=4)
    for extra in ({}, {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3}, {"min_new_tokens": 6}):
        kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=16, **extra)
        expected = target.generate(ids, **kwargs)
        assert torch.equal(target.generate(ids, custom_generate=fast_generate, drafter=drafter, **kwargs), expected)


@pytest.mark.parametrize("draft", ["sample", "argmax"])
def test_top_k_1_sampling_is_greedy_on_both_paths(draft):
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    ids = random_prompt(19, 6)
    expected = greedy_reference(target, ids, 16)
    out = dflash_generate(target, drafter, ids, max_new_tokens=16, temperature=1.3, top_k=1, draft=draft)
    assert torch.equal(out.sequences, expected)
    kwargs = dict(do_sample=True, temperature=1.3, top_k=1, max_new_tokens=16)
    assert torch.equal(
        target.generate(ids, custom_generate=fast_generate, drafter=drafter, draft=draft, **kwargs), expected
    )


def test_custom_generate_streams_and_stops_like_generate():
    ids = random_prompt(14, 5, 48)
    target, expected, drafter = forced_pair("llama", ids, 20, block_size=4, accept_all=True)
    stop = int(expected[0, ids.shape[1] + 5])
    streamer, plain = RecordingStreamer(), RecordingStreamer()
    kwargs = dict(do_sample=False, max_new_tokens=20, eos_token_id=stop)
    out = target.generate(ids, custom_generate=fast_generate, drafter=drafter, streamer=streamer, **kwargs)
    reference = target.generate(ids, streamer=plain, **kwargs)
    assert torch.equal(out, reference) and out[0, -1] == stop
    assert streamer.puts[0] == plain.puts[0] and streamer.ended
    assert sum(streamer.puts[1:], []) == sum([[t] if isinstance(t, int) else t for t in plain.puts[1:]], [])


def test_spec_generate_keeps_z_labs_convention():
    ids = random_prompt(15, 6, 48)
    target, expected, drafter = forced_pair("qwen3", ids, 20, block_size=4, seed=6)
    stop = int(expected[0, ids.shape[1] + 3])
    sequences, stats = drafter.spec_generate(target, ids, max_new_tokens=20, stop_token_ids=[stop], return_stats=True)
    cut = ids.shape[1] + expected[0, ids.shape[1] :].tolist().index(stop) + 1
    assert torch.equal(sequences, expected[:, :cut]) and stats.tau >= 1


@pytest.mark.parametrize(
    "compile",
    [
        pytest.param({"backend": "aot_eager"}, id="aot_eager"),  # the same dynamo capture as compile=True, ~15 s
        pytest.param(
            True,
            id="inductor",
            marks=pytest.mark.skipif(not os.environ.get("DFLASH_SLOW_TESTS"), reason="~90 s of C++ codegen on CPU"),
        ),
    ],
)
def test_compiled_steps_are_lossless(compile):
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    ids = random_prompt(16, 7)
    engine = DFlashEngine(target, drafter, compile=compile)
    out = engine.generate(ids, max_new_tokens=16)
    assert torch.equal(out.sequences, greedy_reference(target, ids, 16))
    assert engine._verify_step is not engine._target_forward and out.stats.steps > 2
    capacity = engine.target_cache.capacity
    assert capacity % 256 == 0  # rounded up, so that another prompt length reuses the cache and the compiled graphs
    other = random_prompt(17, 11)
    assert torch.equal(engine.generate(other, max_new_tokens=12).sequences, greedy_reference(target, other, 12))
    assert engine.target_cache.capacity == capacity


def _bad(name: str, target, drafter):
    ids = random_prompt(0, 5)
    calls = {
        "empty prompt": lambda: dflash_generate(target, drafter, ids[:, :0]),
        "empty row": lambda: dflash_generate(target, drafter, ids, attention_mask=torch.zeros_like(ids)),
        "max_new_tokens": lambda: dflash_generate(target, drafter, ids, max_new_tokens=0),
        "too long": lambda: dflash_generate(target, drafter, ids, max_new_tokens=600),
        "mask shape": lambda: dflash_generate(target, drafter, ids, attention_mask=torch.ones(1, 4)),
        "right padding": lambda: dflash_generate(target, drafter, ids, attention_mask=torch.tensor([[1, 1, 1, 1, 0]])),
        "batch streamer": lambda: dflash_generate(target, drafter, ids.repeat(2, 1), streamer=RecordingStreamer()),
        "verify_length": lambda: dflash_generate(target, drafter, ids, verify_length=4),
        "temperature": lambda: dflash_generate(target, drafter, ids, temperature=-1.0),
        "mismatch": lambda: dflash_generate(make_target("llama", hidden_size=64), drafter, ids),
        "no drafter": lambda: target.generate(ids, custom_generate=fast_generate, max_new_tokens=4),
    }
    return calls[name]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("empty prompt", "prompt is empty"),
        ("empty row", "give each row >= 1 token"),
        ("max_new_tokens", "max_new_tokens must be >= 1"),
        ("too long", r"max_position_embeddings \(512\); use max_new_tokens <= 507"),
        ("mask shape", "attention_mask has shape"),
        ("right padding", "padding_side='left'"),
        ("batch streamer", "batch size 1"),
        ("verify_length", r"int in 1\.\.3"),
        ("temperature", "temperature must be >= 0"),
        ("mismatch", "hidden size"),
        ("no drafter", "drafter=d"),
    ],
)
def test_bad_input_raises_a_clear_error(name, message):
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    with pytest.raises(ValueError, match=message):
        _bad(name, target, drafter)()


def test_eos_default_comes_from_the_target():
    target = make_target("llama", **FORCED)
    ids = random_prompt(17, 5, 48)
    assert target.generation_config.eos_token_id == EOS
    target.generation_config.eos_token_id = int(greedy_reference(target, ids, 10)[0, -3])
    out = dflash_generate(target, make_drafter(target, block_size=4), ids, max_new_tokens=10)
    assert torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=10))
    assert out.sequences.shape[1] < ids.shape[1] + 10


def test_one_host_sync_per_step(monkeypatch, host_syncs):
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    ids = random_prompt(18, 6)
    syncs = host_syncs
    runs = []
    for max_new_tokens in (10, 30):
        syncs.clear()
        out = dflash_generate(target, drafter, ids, max_new_tokens=max_new_tokens, stop_token_ids=[])
        runs.append((len(syncs), out.stats.steps))
    monkeypatch.undo()
    (syncs_short, steps_short), (syncs_long, steps_long) = runs
    assert steps_long > steps_short and syncs_long - syncs_short == steps_long - steps_short
