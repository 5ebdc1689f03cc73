"""`--target-layers` / `--draft-layers`: reshaping a trained drafter (`training.reshape`) without changing what it drafts."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from conftest import MASK, make_drafter, make_target, write_responses
from safetensors.torch import load_file

from transformers_dflash import DFlashDraftModel, extract_context_features, hidden_state_indices
from transformers_dflash.training.arguments import layer_list
from transformers_dflash.training.checkpoint import list_checkpoints
from transformers_dflash.training.cli import main
from transformers_dflash.training.export import record_target
from transformers_dflash.training.reshape import reshape_config, reshape_drafter


def _context(target, ids: list[int]) -> torch.Tensor:
    """(1, 12, F * H) target features of a fixed token row for layers `ids`."""
    tokens = torch.arange(4, 16)[None]
    with torch.no_grad():
        out = target.model(tokens, output_hidden_states=hidden_state_indices(ids))
    return extract_context_features(out.hidden_states, ids)


def reselect_target_layers(drafter: DFlashDraftModel, layer_ids: list[int]) -> DFlashDraftModel:
    reshape_drafter(drafter, reshape_config(drafter.config, target_layer_ids=layer_ids))
    return drafter


def test_added_target_layers_start_at_zero_so_the_drafter_drafts_as_before() -> None:
    target = make_target("llama", num_layers=6)
    drafter = make_drafter(target, num_layers=1, features=2)  # reads [1, 3]
    before_ids = list(drafter.target_layer_ids)
    assert before_ids == [1, 3]
    embeds = target.get_input_embeddings()(torch.tensor([[7, MASK, MASK, MASK]]))
    with torch.no_grad():
        before = drafter(embeds, _context(target, before_ids)).last_hidden_state
        old_fc = drafter.fc.weight.clone()
    reselect_target_layers(drafter, [1, 3, 5])  # the last layer added
    assert drafter.target_layer_ids == [1, 3, 5] and drafter.config.dflash_config["target_layer_ids"] == [1, 3, 5]
    assert drafter.fc.weight.shape == (32, 3 * 32)
    assert torch.equal(drafter.fc.weight[:, :64], old_fc) and not drafter.fc.weight[:, 64:].any()
    with torch.no_grad():
        after = drafter(embeds, _context(target, [1, 3, 5])).last_hidden_state
    assert torch.equal(before, after)
    # a dropped layer takes its block with it; a kept one keeps its block wherever it now sits
    reselect_target_layers(drafter, [3, 4])
    assert torch.equal(drafter.fc.weight[:, :32], old_fc[:, 32:]) and not drafter.fc.weight[:, 32:].any()


def test_reselected_drafter_saves_and_loads_with_its_new_shape(tmp_path) -> None:
    target = make_target("qwen3", num_layers=6)
    drafter = reselect_target_layers(make_drafter(target, num_layers=1, features=2), [0, 1, 2, 5])
    drafter.save_pretrained(tmp_path / "d")
    loaded = DFlashDraftModel.from_pretrained(tmp_path / "d")
    assert loaded.target_layer_ids == [0, 1, 2, 5] and torch.equal(loaded.fc.weight, drafter.fc.weight)
    nested = json.loads((tmp_path / "d" / "config.json").read_text())["dflash_config"]
    assert nested["target_layer_ids"] == [0, 1, 2, 5]  # the z-lab layout's copy, which vLLM and SGLang read


def test_layer_lists_are_checked_with_a_clear_message() -> None:
    assert layer_list("1,8,14,20,27,29") == [1, 8, 14, 20, 27, 29]
    for bad in ("3,1", "1,1", "-1,2", "1;2", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="layer ids"):
            layer_list(bad)
    config = make_drafter(make_target("llama", num_layers=4), features=2).config
    with pytest.raises(ValueError, match="outside the target's depth"):
        reshape_config(config, target_layer_ids=[1, 4])
    assert reshape_config(config, target_layer_ids=[1, 2]).target_layer_ids == [1, 2]
    assert config.target_layer_ids == [0, 3]  # a copy
    with pytest.raises(ValueError, match="can only be added"):
        reshape_config(config, num_hidden_layers=1)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_added_draft_layers_start_as_the_identity_and_then_learn(family: str) -> None:
    target = make_target(family, num_layers=6)
    drafter = make_drafter(target, num_layers=1, features=2)
    embeds = target.get_input_embeddings()(torch.tensor([[7, MASK, MASK, MASK]]))
    context = _context(target, drafter.target_layer_ids)
    with torch.no_grad():
        before = drafter(embeds, context).last_hidden_state
    changes = reshape_drafter(drafter, reshape_config(drafter.config, num_hidden_layers=3))
    assert changes == ["draft layers 1 -> 3 (new ones start as identity)"]
    assert len(drafter.layers) == 3 and drafter.config.num_hidden_layers == 3 and len(drafter.config.layer_types) == 3
    with torch.no_grad():
        assert torch.equal(drafter(embeds, context).last_hidden_state, before)
    assert drafter.layers[2].self_attn.q_proj.weight.abs().sum() > 0  # initialised, not zero: it can learn
    loss = drafter(embeds, context).last_hidden_state.square().sum()
    loss.backward()
    assert drafter.layers[2].self_attn.o_proj.weight.grad.abs().sum() > 0


def test_cli_reshapes_an_init_drafter_and_refuses_another_shape_on_resume(tmp_path) -> None:
    target = make_target("llama")
    target.save_pretrained(tmp_path / "target")
    init = make_drafter(target, block_size=4, num_layers=1, features=2)  # reads [0, 3] of 4 layers
    record_target(init.config, target)
    init.save_pretrained(tmp_path / "init")
    work = write_responses(tmp_path / "run", 2)
    flags = ["--work-dir", str(work), "--target", str(tmp_path / "target"), "--init-from", str(tmp_path / "init")]
    flags += ["--draft-layers", "2", "--target-layers", "0,2,3"]
    main(["features", *flags, "--labels", "target"])
    assert json.loads((work / "features" / "meta.json").read_text())["target_layer_ids"] == [0, 2, 3]
    train = ["--num-anchors", "4", "--epochs", "1", "--eval-prompts", "0", "--lr", "0", "--weight-decay", "0"]
    main(["train", *flags, *train, "--labels", "target", "--features", "cache"])
    checkpoint = list_checkpoints(work / "checkpoints")[-1]
    saved = load_file(checkpoint / "model.safetensors")  # lr 0: the reshaped init, unchanged
    fc = saved["fc.weight"]
    for name, weight in init.state_dict().items():
        if name != "fc.weight":
            assert torch.equal(saved[name], weight), name
    assert not saved["layers.1.self_attn.o_proj.weight"].any() and not saved["layers.1.mlp.down_proj.weight"].any()
    old = init.fc.weight.detach()
    assert torch.equal(fc[:, :32], old[:, :32]) and not fc[:, 32:64].any() and torch.equal(fc[:, 64:], old[:, 32:])
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == [0, 2, 3] and config["num_hidden_layers"] == 2
    flags[-1] = "0,1,3"
    with pytest.raises(ValueError, match=r"--target-layers \[0, 1, 3\] \(the run: \[0, 2, 3\]\)"):
        main(["train", *flags, *train, "--epochs", "2"])
