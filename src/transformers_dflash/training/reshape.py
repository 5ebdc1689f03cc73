"""Giving a trained drafter a new shape without changing what it drafts: more draft layers, other target layers.

Both start the new parts at zero so a warm start (`dflash-train train --init-from DRAFTER`) begins exactly where the
drafter was, and training decides how much to use them:

- target layers (`--target-layers`): `fc` maps the concatenated target features (F layers x H) to the drafter's
  width, one column block per layer. The block of every layer still read is kept (wherever it now sits); a newly
  read layer's block starts at zero; a dropped layer's block goes.
- draft depth (`--draft-layers`, more than the drafter has): new decoder layers are appended with their output
  projections (`self_attn.o_proj`, `mlp.down_proj`) at zero, so each is the identity on the residual stream until
  trained (the other weights get the usual initialisation, so gradients reach them after the first step).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..configuration_dflash import DFlashConfig
from ..modeling_dflash import DFlashDecoderLayer, DFlashDraftModel


def reshape_config(
    config: DFlashConfig, *, target_layer_ids: list[int] | None = None, num_hidden_layers: int | None = None
) -> DFlashConfig:
    """A copy of `config` reading `target_layer_ids` and with `num_hidden_layers` draft layers (None: unchanged).

    Refuses target layers outside the target's depth (the config's own check), and fewer draft layers than
    `config` has (a trained layer cannot be dropped without changing what the drafter computes).
    """
    changed = copy.deepcopy(config)
    if target_layer_ids is not None:
        changed.target_layer_ids = list(target_layer_ids)
        changed.dflash_config = {**(changed.dflash_config or {}), "target_layer_ids": list(target_layer_ids)}
    if num_hidden_layers is not None and num_hidden_layers != config.num_hidden_layers:
        if num_hidden_layers < config.num_hidden_layers:
            raise ValueError(
                f"--draft-layers {num_hidden_layers}: the drafter has {config.num_hidden_layers} trained layers and "
                "layers can only be added; leave --draft-layers out to keep its depth."
            )
        changed.num_hidden_layers = num_hidden_layers
        if getattr(config, "layer_types", None):  # new layers repeat the last layer's attention type
            added = num_hidden_layers - len(config.layer_types)
            changed.layer_types = list(config.layer_types) + [config.layer_types[-1]] * added
    changed._check()
    return changed


def reshape_drafter(drafter: DFlashDraftModel, config: DFlashConfig) -> list[str]:
    """Makes `drafter` (in place) read `config.target_layer_ids` and have `config.num_hidden_layers` layers, as the
    module doc describes; returns what changed, in words (empty when nothing did)."""
    old = drafter.config
    changes = []
    if list(config.target_layer_ids) != list(old.target_layer_ids):
        changes.append(f"target layers {old.target_layer_ids} -> {config.target_layer_ids} (new ones start at 0)")
        _reselect_target_layers(drafter, old.target_layer_ids, config.target_layer_ids)
    if config.num_hidden_layers != old.num_hidden_layers:
        changes.append(
            f"draft layers {old.num_hidden_layers} -> {config.num_hidden_layers} (new ones start as identity)"
        )
        _append_layers(drafter, config)
    for key in ("target_layer_ids", "dflash_config", "num_hidden_layers", "layer_types"):
        setattr(old, key, copy.deepcopy(getattr(config, key, None)))
    return changes


def _reselect_target_layers(drafter: DFlashDraftModel, old_ids: list[int], layer_ids: list[int]) -> None:
    hidden = drafter.config.hidden_size
    old = drafter.fc.weight.detach()  # (H, F_old * H)
    weight = old.new_zeros(hidden, len(layer_ids) * hidden)  # (H, F_new * H)
    for slot, layer in enumerate(layer_ids):
        if layer in old_ids:
            j = old_ids.index(layer)
            weight[:, slot * hidden : (slot + 1) * hidden] = old[:, j * hidden : (j + 1) * hidden]
    fc = nn.Linear(weight.shape[1], hidden, bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        fc.weight.copy_(weight)
    drafter.fc = fc


def _append_layers(drafter: DFlashDraftModel, config: DFlashConfig) -> None:
    reference = drafter.fc.weight
    for index in range(len(drafter.layers), config.num_hidden_layers):
        layer = DFlashDecoderLayer(config, index).to(device=reference.device, dtype=reference.dtype)
        layer.apply(drafter._init_weights)
        with torch.no_grad():
            for projection in (layer.self_attn.o_proj, layer.mlp.down_proj):
                projection.weight.zero_()
                if projection.bias is not None:
                    projection.bias.zero_()
        drafter.layers.append(layer)
