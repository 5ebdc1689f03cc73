"""DFlashDraftModel: KV injection, bidirectional block attention, cache semantics, masks, attention backends."""

import pytest
import torch
from conftest import make_drafter, make_target
from transformers import DynamicCache

from transformers_dflash import extract_context_features, hidden_state_indices
from transformers_dflash.modeling_dflash import layer_attention_mask

H, F = 32, 2


@pytest.fixture
def drafter():
    return make_drafter(make_target("qwen3"), block_size=4, num_layers=2)


def run(drafter, block, context, positions=None, **kw):
    return drafter(noise_embeds=block, context_hidden_states=context, position_ids=positions, **kw).last_hidden_state


def test_output_shape_and_context_conditioning(drafter):
    block, context = torch.randn(2, 4, H), torch.randn(2, 6, F * H)
    out = run(drafter, block, context)
    assert out.shape == (2, 4, H)
    assert not torch.allclose(out, run(drafter, block, context + 1.0)), "context must condition the block"


def test_block_attention_is_bidirectional(drafter):
    block, context = torch.randn(1, 4, H), torch.randn(1, 3, F * H)
    changed = block.clone()
    changed[:, -1] += 1.0
    a, b = run(drafter, block, context), run(drafter, changed, context)
    assert not torch.allclose(a[:, 0], b[:, 0]), "the first block position must see the last one"


def test_eager_and_sdpa_agree(drafter):
    block, context = torch.randn(2, 4, H), torch.randn(2, 5, F * H)
    sdpa = run(drafter, block, context)
    drafter.config._attn_implementation = "eager"
    torch.testing.assert_close(run(drafter, block, context), sdpa, atol=1e-5, rtol=1e-4)


def test_cache_keeps_context_and_matches_a_single_pass(drafter):
    """Context fed in two steps through a cache (block K/V cropped between) equals one pass over all context."""
    block, ctx = torch.randn(1, 4, H), torch.randn(1, 7, F * H)
    full = run(drafter, block, ctx, torch.arange(11)[None])
    cache = DynamicCache(config=drafter.config)
    run(drafter, torch.randn(1, 4, H), ctx[:, :5], torch.arange(9)[None], cache=cache)
    cache.crop(-4)  # drop the first block's K/V: only context stays
    assert cache.get_seq_length() == 5
    stepped = run(drafter, block, ctx[:, 5:], torch.arange(5, 11)[None], past_key_values=cache)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-4)


def test_default_positions_follow_the_cache(drafter):
    block, ctx = torch.randn(1, 4, H), torch.randn(1, 3, F * H)
    torch.testing.assert_close(run(drafter, block, ctx), run(drafter, block, ctx, torch.arange(7)[None]))


def test_key_padding_mask_hides_padded_context(drafter):
    block, ctx = torch.randn(1, 4, H), torch.randn(1, 5, F * H)
    mask = torch.ones(1, 9, dtype=torch.long)
    mask[:, :2] = 0
    masked = run(drafter, block, ctx, torch.arange(9)[None], attention_mask=mask)
    perturbed = ctx.clone()
    perturbed[:, :2] += 3.0
    torch.testing.assert_close(run(drafter, block, perturbed, torch.arange(9)[None], attention_mask=mask), masked)


def test_sliding_window_mask_matches_brute_force():
    q, kv, window = 4, 12, 5
    mask = layer_attention_mask(None, q, kv, window, None)[0, 0]
    for i in range(q):
        for j in range(kv):
            assert bool(mask[i, j]) == ((kv - q + i) - j < window)
    assert layer_attention_mask(None, q, 5, window, None) is None, "no mask needed inside the window"
    additive = layer_attention_mask(torch.ones(1, kv), q, kv, window, torch.float32)
    assert additive.dtype == torch.float32 and (additive[0, 0] == 0).eq(mask).all()


def test_gradient_checkpointing_gives_the_same_gradients(drafter):
    block, ctx = torch.randn(1, 4, H), torch.randn(1, 3, F * H)
    drafter.train()
    run(drafter, block, ctx).square().sum().backward()
    plain = drafter.fc.weight.grad.clone()
    drafter.zero_grad()
    enable = getattr(drafter, "activation_checkpointing_enable", None) or drafter.gradient_checkpointing_enable
    enable()  # renamed in transformers 5.24
    run(drafter, block, ctx).square().sum().backward()
    torch.testing.assert_close(drafter.fc.weight.grad, plain)


def test_hidden_state_offset_is_plus_one():
    target = make_target("llama")
    ids = torch.tensor([[5, 6, 7]])
    full = target(ids, output_hidden_states=True).hidden_states
    assert hidden_state_indices([0, 3]) == [1, 4]
    feats = extract_context_features(full, [0, 3])
    torch.testing.assert_close(feats, torch.cat([full[1], full[4]], dim=-1))
    selected = target(ids, output_hidden_states=hidden_state_indices([0, 3])).hidden_states
    torch.testing.assert_close(extract_context_features(selected, [0, 3]), feats)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"context_hidden_states": torch.randn(1, 3, H)}, "expected 64 = 2 target layers"),
        ({"context_hidden_states": torch.randn(1, 3, F * H), "position_ids": torch.arange(4)[None]}, "must cover"),
    ],
)
def test_bad_inputs_name_the_fix(drafter, kwargs, message):
    with pytest.raises(ValueError, match=message):
        drafter(noise_embeds=torch.randn(1, 4, H), **kwargs)
