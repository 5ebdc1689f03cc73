"""`target.generate(assistant_model=drafter)`: lossless on both calls, forced long accepts, z-lab drafters, errors."""

import itertools
import math

import pytest
import torch
from conftest import (
    MASK,
    ForcedAcceptanceDrafter,
    greedy_reference,
    make_drafter,
    make_forced_drafter,
    make_target,
    random_prompt,
)
from transformers.modeling_outputs import BaseModelOutputWithPast

from transformers_dflash import DFlashConfig, DFlashDraftModel
from transformers_dflash.drafter_types import as_native_drafter
from transformers_dflash.hub import target_fingerprint
from transformers_dflash.zlab_adapter import ZLabDrafterAdapter


def dflash_generate_call(target, drafter, ids, flagged: bool, **kw):
    extra = {"speculation_type": "dflash"} if flagged else {}
    return target.generate(
        ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, do_sample=False, **extra, **kw
    )


@pytest.mark.parametrize(
    ("block_size", "tie", "flagged"),
    [(2, False, False), (4, True, True), (8, False, True), (16, True, False)],
    ids=["b2-untied-gqa-plain", "b4-tied-mha-flagged", "b8-untied-gqa-flagged", "b16-tied-mha-plain"],
)
def test_lossless_random_drafter(family, block_size, tie, flagged):
    target = make_target(family, tie=tie, gqa=not tie)
    drafter = make_drafter(target, block_size=block_size)
    for seed in range(3):
        ids = random_prompt(seed + 10 * block_size, 3 + 4 * seed)
        expected = greedy_reference(target, ids, 24)
        assert torch.equal(dflash_generate_call(target, drafter, ids, flagged, max_new_tokens=24), expected)


class CountingDrafter(ForcedAcceptanceDrafter):
    calls = 0

    def forward(self, *args, **kwargs):
        type(self).calls += 1
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_forced_acceptance_long_accepts_stay_lossless(family, block_size):
    target = make_target(family, vocab_size=48, hidden_size=64)
    for seed in range(3):
        ids = random_prompt(seed, 5, vocab_size=48)
        expected = greedy_reference(target, ids, 40)
        drafter = make_forced_drafter(
            target, expected.tolist(), block_size=block_size, seed=seed, accept_all=seed == 0
        )
        drafter.__class__ = CountingDrafter
        CountingDrafter.calls = 0
        assert torch.equal(dflash_generate_call(target, drafter, ids, False, max_new_tokens=40), expected)
        if seed == 0:  # every block accepted: ~40 / block_size steps instead of 40
            assert CountingDrafter.calls <= math.ceil(40 / block_size) + 1


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 4, 5])
def test_short_max_new_tokens(family, max_new_tokens):
    target = make_target(family, vocab_size=48, hidden_size=64)
    ids = random_prompt(7, 6, vocab_size=48)
    full = greedy_reference(target, ids, 12)
    drafter = make_forced_drafter(target, full.tolist(), block_size=4, accept_all=True)
    expected = full[:, : ids.shape[1] + max_new_tokens]
    assert torch.equal(dflash_generate_call(target, drafter, ids, True, max_new_tokens=max_new_tokens), expected)


def test_eos_inside_an_accepted_block_stops_where_generate_stops(family):
    target = make_target(family, vocab_size=48, hidden_size=64)
    ids = random_prompt(3, 5, vocab_size=48)
    free_run = greedy_reference(target, ids, 30)[0].tolist()
    stop = free_run[ids.shape[1] + 6]  # a token the target emits mid-generation becomes the stop token
    target.generation_config.eos_token_id = stop
    expected = greedy_reference(target, ids, 30)
    assert expected.shape[1] < ids.shape[1] + 30 and expected[0, -1] == stop
    drafter = make_forced_drafter(target, [free_run], block_size=8, accept_all=True)
    assert torch.equal(dflash_generate_call(target, drafter, ids, False, max_new_tokens=30), expected)


def test_sampling_matches_the_targets_distribution():
    """Chi-square goodness of fit of the first two sampled tokens against the target's exact joint probability."""
    vocab = 8
    target = make_target("llama", vocab_size=vocab, hidden_size=32, num_layers=2, seed=4)
    with torch.no_grad():
        for p in target.parameters():
            p.mul_(0.25)  # flatter distributions, so many cells are populated
    target.generation_config.eos_token_id = None
    drafter = make_drafter(target, block_size=4)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        first = target(ids).logits[0, -1].softmax(-1)
        pairs = torch.cat([ids.repeat(vocab, 1), torch.arange(vocab)[:, None]], dim=1)
        second = target(pairs).logits[:, -1].softmax(-1)
    exact = (first[:, None] * second).flatten()  # p(t1, t2)
    torch.manual_seed(0)
    n = 600
    counts = torch.zeros(vocab * vocab)
    for _ in range(n):
        out = target.generate(ids, assistant_model=drafter, do_sample=True, max_new_tokens=2, top_k=0, pad_token_id=0)
        t1, t2 = out[0, 3:5].tolist()
        counts[t1 * vocab + t2] += 1
    expected = exact * n
    keep = expected >= 5  # pool small cells, as the chi-square approximation requires
    observed, expected = counts[keep], expected[keep]
    if not keep.all():
        observed = torch.cat([observed, counts[~keep].sum()[None]])
        expected = torch.cat([expected, (exact * n)[~keep].sum()[None]])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    dof = len(observed) - 1
    assert chi2 < dof + 4 * math.sqrt(2 * dof), f"chi2={chi2:.1f} with {dof} degrees of freedom"


class ZLabStyleDrafter(torch.nn.Module):
    """Mimics the interface of z-lab's remote-code class: nested config, `forward(position_ids, noise_embedding=,
    target_hidden=, past_key_values=)` returning the normed hidden states. Its computation is ours."""

    def __init__(self, inner: DFlashDraftModel) -> None:
        super().__init__()
        self.inner = inner
        self.config = type(inner.config).__mro__[1].from_dict(inner.config.to_dict())  # a plain Qwen3Config
        self.block_size = inner.config.block_size
        self.target_layer_ids = inner.config.target_layer_ids

    def forward(self, position_ids, attention_mask=None, noise_embedding=None, target_hidden=None, past_key_values=None,
                use_cache=False, **kwargs):  # fmt: skip
        assert attention_mask is None or attention_mask.dim() == 4
        return self.inner(
            noise_embedding, target_hidden, position_ids, attention_mask, past_key_values
        ).last_hidden_state


def test_zlab_remote_code_instance_is_adapted_without_copying(family):
    target = make_target(family)
    inner = make_drafter(target, block_size=4)
    zlab = ZLabStyleDrafter(inner)
    assert type(zlab.config).__name__ == "Qwen3Config" and not hasattr(zlab.config, "mask_token_id")
    adapter = as_native_drafter(zlab)
    assert isinstance(adapter, ZLabDrafterAdapter) and as_native_drafter(zlab) is adapter
    assert adapter.config.mask_token_id == MASK and adapter.config.block_size == 4
    assert adapter.drafter.inner.fc.weight.data_ptr() == inner.fc.weight.data_ptr()
    out = adapter(torch.randn(1, 4, 32), torch.randn(1, 3, 64), torch.arange(7)[None])
    assert isinstance(out, BaseModelOutputWithPast) and out.last_hidden_state.shape == (1, 4, 32)
    for seed, flagged in itertools.product(range(2), (False, True)):
        ids = random_prompt(seed, 6)
        expected = greedy_reference(target, ids, 20)
        assert torch.equal(dflash_generate_call(target, zlab, ids, flagged, max_new_tokens=20), expected)


def test_plain_generate_without_a_drafter_is_untouched():
    target = make_target()
    ids = random_prompt(0, 4)
    assert target.generate(ids, max_new_tokens=5, do_sample=False).shape == (1, 9)


@pytest.mark.parametrize(
    ("make_bad", "message"),
    [
        (lambda t, d: (make_target(hidden_size=64), d), "hidden size 32, the target has 64"),
        (lambda t, d: (make_target(num_layers=6), d), "trained for a target with 4 layers"),
        (lambda t, d: (t, d.to(torch.float64)), r"drafter.to\(torch.float32\)"),
        (lambda t, d: (make_target(vocab_size=3), d), "outside the target's vocabulary"),
    ],
    ids=["hidden", "depth", "dtype", "vocab"],
)
def test_pair_check_errors(make_bad, message):
    target = make_target()
    target, drafter = make_bad(target, make_drafter(target))
    ids = torch.tensor([[2, 2, 2]])
    with pytest.raises(ValueError, match=message):
        target.generate(ids, assistant_model=drafter, max_new_tokens=4)


def test_wrong_trained_target_is_refused():
    target, other = make_target(seed=0), make_target(seed=5)
    drafter = make_drafter(target)
    drafter.config.dflash_config["target"] = {"name_or_path": "tiny-0", "fingerprint": target_fingerprint(target)}
    ids = random_prompt(0, 4)
    target.generate(ids, assistant_model=drafter, max_new_tokens=4)
    with pytest.raises(ValueError, match="trained for 'tiny-0'"):
        other.generate(ids, assistant_model=drafter, max_new_tokens=4)


def test_trained_target_check_survives_a_dtype_change():
    target = make_target(seed=0)
    drafter = make_drafter(target)
    drafter.config.dflash_config["target"] = {"name_or_path": "tiny-0", "fingerprint": target_fingerprint(target)}
    target, drafter = target.to(torch.bfloat16), drafter.to(torch.bfloat16)
    ids = random_prompt(0, 4)
    out = target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids.shape[1]


def test_batch_on_the_native_path_points_to_the_engine():
    target = make_target()
    with pytest.raises(ValueError, match="dflash_generate"):
        target.generate(random_prompt(0, 4).repeat(2, 1), assistant_model=make_drafter(target), max_new_tokens=4)


def test_output_hidden_states_gets_a_clear_error():
    target = make_target()
    with pytest.raises(ValueError, match="output_hidden_states=True is not supported"):
        target.generate(random_prompt(0, 4), assistant_model=make_drafter(target), output_hidden_states=True,
                        return_dict_in_generate=True, max_new_tokens=4)  # fmt: skip


def test_other_speculation_type_with_a_dflash_drafter_is_refused():
    target = make_target()
    with pytest.raises(ValueError, match="speculation_type='dflash'"):
        target.generate(random_prompt(0, 4), assistant_model=make_drafter(target), speculation_type="other")


def test_config_survives_generation_unchanged():
    target = make_target()
    drafter = make_drafter(target)
    before = drafter.config.to_dict()
    target.generate(random_prompt(0, 4), assistant_model=drafter, max_new_tokens=6)
    assert drafter.config.to_dict() == before and isinstance(drafter.config, DFlashConfig)
