"""Checkpoints: z-lab layout in, z-lab layout out, remote code, safetensors only."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import MASK, greedy_reference, make_drafter, make_target, random_prompt
from safetensors.torch import save_file
from transformers import AutoModel

from transformers_dflash import DFlashDraftModel
from transformers_dflash.hub import PACKAGE_DIR, remote_code_modules

ZLAB_PARAM_SUFFIXES = [
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
]


def probe(drafter):
    g = torch.Generator().manual_seed(0)
    block = torch.randn(1, 4, 32, generator=g)
    ctx = torch.randn(1, 5, drafter.fc.in_features, generator=g)
    with torch.no_grad():
        return drafter(noise_embeds=block, context_hidden_states=ctx).last_hidden_state


def write_zlab_checkpoint(path: Path, layers: int = 2) -> dict[str, torch.Tensor]:
    """A directory as the z-lab Hub repos lay it out: their config dialect, their parameter names."""
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "block_size": 4,
        "num_target_layers": 4,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [1, 2]},
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "num_hidden_layers": layers,
        "vocab_size": 96,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "max_position_embeddings": 512,
        "layer_types": ["full_attention"] * layers,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    shapes = {
        "self_attn.q_proj.weight": (32, 32),
        "self_attn.k_proj.weight": (16, 32),
        "self_attn.v_proj.weight": (16, 32),
        "self_attn.o_proj.weight": (32, 32),
        "self_attn.q_norm.weight": (8,),
        "self_attn.k_norm.weight": (8,),
        "mlp.gate_proj.weight": (64, 32),
        "mlp.up_proj.weight": (64, 32),
        "mlp.down_proj.weight": (32, 64),
        "input_layernorm.weight": (32,),
        "post_attention_layernorm.weight": (32,),
    }
    g = torch.Generator().manual_seed(3)
    weights = {
        f"layers.{i}.{name}": torch.randn(shape, generator=g) for i in range(layers) for name, shape in shapes.items()
    }
    weights |= {"fc.weight": torch.randn(32, 64, generator=g), "norm.weight": torch.randn(32, generator=g)}
    weights["hidden_norm.weight"] = torch.randn(32, generator=g)
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(weights, str(path / "model.safetensors"))
    return weights


def test_zlab_checkpoint_loads_with_no_missing_or_unexpected_keys(tmp_path):
    weights = write_zlab_checkpoint(tmp_path / "zlab")
    drafter, info = DFlashDraftModel.from_pretrained(tmp_path / "zlab", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    state = drafter.state_dict()
    assert set(state) == set(weights)
    for name, value in weights.items():
        assert torch.equal(state[name], value), name
    assert (drafter.block_size, drafter.mask_token_id, drafter.target_layer_ids) == (4, MASK, [1, 2])


def test_save_writes_zlab_layout_and_reloads_identically(tmp_path):
    drafter = make_drafter(make_target())
    drafter.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == "qwen3" and saved["architectures"] == ["DFlashDraftModel"]
    assert saved["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
    assert saved["dflash_config"]["mask_token_id"] == MASK and "block_size" in saved
    names = {p.name for p in (tmp_path / "ours").iterdir()}
    assert {"config.json", "model.safetensors", "dflash.py"} <= names and not any(n.endswith(".bin") for n in names)
    again = DFlashDraftModel.from_pretrained(tmp_path / "ours")
    torch.testing.assert_close(probe(again), probe(drafter))


def test_shipped_code_is_the_package_code_not_a_copy_kept_by_hand(tmp_path):
    make_drafter(make_target()).save_pretrained(tmp_path / "ours")
    for name in remote_code_modules():
        assert (tmp_path / "ours" / f"{name}.py").read_bytes() == (PACKAGE_DIR / f"{name}.py").read_bytes()
    assert set(remote_code_modules()) == {
        "checkpoint_checks",
        "compat",
        "configuration_dflash",
        "draft_vocab",
        "modeling_dflash",
    }


def test_trust_remote_code_load_in_a_fresh_process(tmp_path):
    drafter = make_drafter(make_target())
    drafter.set_draft_vocab(torch.tensor([4, 8, 15]))
    drafter.save_pretrained(tmp_path / "ours")
    expected = probe(drafter)
    torch.save(expected, tmp_path / "expected.pt")
    script = f"""
import torch, sys
from transformers import AutoModel
assert "transformers_dflash" not in sys.modules
m = AutoModel.from_pretrained({str(tmp_path / "ours")!r}, trust_remote_code=True).eval()
assert type(m).__name__ == "DFlashDraftModel" and "transformers_modules" in type(m).__module__, type(m).__module__
assert "transformers_dflash" not in sys.modules, "remote code must not need this package"
assert m.draft_vocab.tolist() == [4, 8, 15]
g = torch.Generator().manual_seed(0)
block = torch.randn(1, 4, 32, generator=g); ctx = torch.randn(1, 5, m.fc.in_features, generator=g)
with torch.no_grad():
    out = m(noise_embeds=block, context_hidden_states=ctx).last_hidden_state
torch.testing.assert_close(out, torch.load({str(tmp_path / "expected.pt")!r}))
print("REMOTE-OK")
"""
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert "REMOTE-OK" in result.stdout, result.stderr[-2000:]


def test_remote_code_instance_drafts_losslessly_through_generate(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    target = make_target()
    make_drafter(target).save_pretrained(tmp_path / "ours")
    remote = AutoModel.from_pretrained(tmp_path / "ours", trust_remote_code=True).eval()
    assert not isinstance(remote, DFlashDraftModel)
    ids = random_prompt(3, 6)
    out = target.generate(ids, assistant_model=remote, max_new_tokens=12, do_sample=False)
    torch.testing.assert_close(out, greedy_reference(target, ids, 12))


def test_pickle_weights_are_refused_unless_allowed(tmp_path):
    drafter = make_drafter(make_target())
    drafter.save_pretrained(tmp_path / "pickled")
    (tmp_path / "pickled" / "model.safetensors").unlink()
    torch.save(drafter.state_dict(), tmp_path / "pickled" / "pytorch_model.bin")
    with pytest.raises((OSError, EnvironmentError, ValueError)):
        DFlashDraftModel.from_pretrained(tmp_path / "pickled")
    loaded = DFlashDraftModel.from_pretrained(tmp_path / "pickled", allow_pickle=True)
    torch.testing.assert_close(probe(loaded), probe(drafter))
