"""`check_pair`: whether a drafter can draft for a target (shapes, layer ids, mask id, recorded target, dtype)."""

from __future__ import annotations

import weakref

import torch
from torch import nn
from transformers import PreTrainedModel

from .configuration_dflash import DFlashConfig
from .drafter_types import as_native_drafter
from .hub import fingerprints_match, target_fingerprint
from .special_ids import id_list

# on the drafter: (weakref to the target, `_pair_state`) of its last passed check
_CHECKED_ATTR = "_dflash_checked_pair"


def _first_param(model: nn.Module) -> torch.nn.Parameter:
    return next(model.parameters())


def check_pair(target: PreTrainedModel, drafter: nn.Module, *, same_device: bool = True) -> None:
    """Raises a ValueError naming the fix when `drafter` cannot draft for `target`.

    Checks hidden size, the target depth the drafter was trained for, its layer ids, the mask id against the
    target's vocabulary and special tokens, the drafter's trained-for target (when the checkpoint records it),
    dtype, and (with `same_device`) device.
    """
    native = as_native_drafter(drafter)
    config, state = native.config, _pair_state(target, drafter, same_device)
    checked = native.__dict__.get(_CHECKED_ATTR)
    if checked is not None and checked[0]() is target and checked[1] == state:
        return  # passed before, and nothing it read has changed since: no per-call cost (the fingerprint syncs CUDA)
    text = target.config.get_text_config()
    depth, hidden = text.num_hidden_layers, text.hidden_size
    vocab = target.get_input_embeddings().weight.shape[0]
    if config.hidden_size != hidden:
        raise ValueError(
            f"This drafter was built for hidden size {config.hidden_size}, the target has {hidden}: it belongs to "
            "another target model. Load the drafter trained for this target."
        )
    if config.num_target_layers is not None and config.num_target_layers != depth:
        raise ValueError(
            f"This drafter was trained for a target with {config.num_target_layers} layers; this target has {depth}. "
            "Load the drafter trained for this target."
        )
    bad = [i for i in config.target_layer_ids if not 0 <= i < depth]
    if bad or not config.target_layer_ids:
        raise ValueError(
            f"target_layer_ids {config.target_layer_ids} must be non-empty 0-based layer ids below the target's "
            f"depth {depth}."
        )
    mask = config.mask_token_id
    if mask is None or not 0 <= mask < vocab:
        raise ValueError(
            f"mask_token_id={mask} is outside the target's vocabulary ({vocab} rows); set the mask id the drafter "
            "was trained with (config.dflash_config['mask_token_id'])."
        )
    if mask == text.pad_token_id or mask in id_list(text.eos_token_id):
        raise ValueError(
            f"mask_token_id={mask} is the target's pad/eos token; the mask must be an otherwise unused token."
        )
    _check_trained_target(config, target)
    target_param, drafter_param = _first_param(target), _first_param(drafter)
    if drafter_param.dtype != target_param.dtype:
        raise ValueError(
            f"The drafter is {drafter_param.dtype} but the target is {target_param.dtype}; the target's lm_head reads "
            f"the drafter's output, so use one dtype: `drafter.to({target_param.dtype})`."
        )
    if same_device and drafter_param.device != target_param.device:
        raise ValueError(
            f"The drafter is on {drafter_param.device}, the target on {target_param.device}: "
            f"move it with `drafter.to('{target_param.device}')`."
        )
    native.__dict__[_CHECKED_ATTR] = (weakref.ref(target), state)


def _pair_state(target: PreTrainedModel, drafter: nn.Module, same_device: bool) -> tuple:
    """What a passed `check_pair` depends on that may change later: dtypes, devices, the embedding's storage and
    its in-place writes (the fingerprint's; e.g. `load_state_dict` of another model), the drafter's mask id and
    layer ids."""
    config = as_native_drafter(drafter).config
    t, d, embed = _first_param(target), _first_param(drafter), target.get_input_embeddings().weight
    ids = tuple(config.target_layer_ids or ())
    storage = embed.data_ptr(), embed._version  # the version counter moves with every in-place write
    return same_device, t.dtype, t.device, d.dtype, d.device, storage, config.mask_token_id, ids


def _check_trained_target(config: DFlashConfig, target: PreTrainedModel) -> None:
    """Refuses a target other than the one recorded in the checkpoint (`dflash_config["target"]`), if any."""
    recorded = (config.dflash_config or {}).get("target")
    if not recorded:
        return
    expected, actual = recorded.get("fingerprint"), target_fingerprint(target)
    if isinstance(expected, list) and not fingerprints_match(expected, actual):
        raise ValueError(
            f"This drafter was trained for {recorded.get('name_or_path', 'another target')!r}, and this target's "
            "token embedding differs from that one's (the `fingerprint` row norms in `dflash_config.target` of "
            "the drafter's config.json). Load the target it was trained for, or train a drafter for this target "
            "with `dflash-train`."
        )
