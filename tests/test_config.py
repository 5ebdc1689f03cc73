"""DFlashConfig: both checkpoint dialects, defaults from the paper, validation."""

import pytest
from conftest import EOS, MASK, PAD, make_target

from transformers_dflash import DFlashConfig, default_target_layer_ids


@pytest.mark.parametrize(
    ("layers", "features", "expected"),
    [(36, 5, [1, 9, 17, 25, 33]), (30, 5, [1, 8, 14, 20, 27]), (28, 1, [14]), (36, 3, [1, 17, 33])],
)
def test_default_target_layers_follow_the_paper(layers, features, expected):
    assert default_target_layer_ids(layers, features) == expected


def test_from_target_config_copies_shapes(family):
    target = make_target(family, tie=True)
    cfg = DFlashConfig.from_target_config(target.config, mask_token_id=MASK, num_hidden_layers=2, block_size=8)
    text = target.config
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (32, 4, 2)
    assert cfg.head_dim == 8 and cfg.vocab_size == text.vocab_size and cfg.rms_norm_eps == text.rms_norm_eps
    assert cfg.rope_parameters["rope_theta"] == text.rope_parameters["rope_theta"]
    assert cfg.num_target_layers == 4 and cfg.block_size == 8 and cfg.mask_token_id == MASK
    assert cfg.target_layer_ids == default_target_layer_ids(4, 2)


@pytest.mark.parametrize("bad_mask", [PAD, EOS])
def test_mask_must_not_be_pad_or_eos(bad_mask):
    with pytest.raises(ValueError, match="otherwise unused"):
        DFlashConfig.from_target_config(make_target().config, mask_token_id=bad_mask)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mask_token_id": 10_000}, "outside the vocabulary"),
        ({"mask_token_id": MASK, "block_size": 1}, "block_size must be >= 2"),
        ({"mask_token_id": MASK, "target_layer_ids": [0, 9]}, "outside the target's depth"),
    ],
)
def test_invalid_values_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DFlashConfig.from_target_config(make_target().config, **kwargs)


def test_writes_the_zlab_dialect():
    cfg = DFlashConfig.from_target_config(make_target().config, mask_token_id=MASK, num_hidden_layers=2)
    d = cfg.to_dict()
    assert d["model_type"] == "qwen3" and d["architectures"] == ["DFlashDraftModel"]
    assert d["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
    assert d["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": cfg.target_layer_ids}
    assert d["block_size"] == 16 and d["num_target_layers"] == 4
    assert "mask_token_id" not in d and "target_layer_ids" not in d
    assert {"layer_types", "sliding_window", "rope_parameters"} <= set(cfg.to_diff_dict())


def test_reads_zlab_dialects_nested_block_size_and_legacy_rope():
    zlab = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "vocab_size": 100,
        "rope_theta": 1_000_000,
        "rope_scaling": None,
        "layer_types": ["full_attention", "sliding_attention"],
        "use_sliding_window": True,
        "sliding_window": 8,
        "num_target_layers": 36,
        "dflash_config": {"mask_token_id": 7, "target_layer_ids": [1, 33], "block_size": 10},
    }
    cfg = DFlashConfig.from_dict(zlab)
    assert (cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids) == (10, 7, [1, 33])
    assert cfg.rope_parameters["rope_theta"] == 1_000_000
    assert cfg.layer_types == ["full_attention", "sliding_attention"] and cfg.sliding_window == 8
    top_level = dict(zlab, block_size=16, dflash_config={"mask_token_id": 7, "target_layer_ids": [1, 33]})
    assert DFlashConfig.from_dict(top_level).block_size == 16


def test_layer_ids_default_from_draft_depth_when_missing():
    cfg = DFlashConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=5, num_target_layers=36, vocab_size=50)
    assert cfg.target_layer_ids == [1, 9, 17, 25, 33]
