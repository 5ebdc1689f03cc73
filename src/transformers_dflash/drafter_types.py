"""What kind of drafter a module is (ours, ours loaded as remote code, z-lab's, adapted), and its native form."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from .modeling_dflash import DFlashDraftModel
from .zlab_adapter import ZLabDrafterAdapter


def _foreign_forward_params(model: Any) -> set[str]:
    """Argument names of `model.forward` for a module that is not our class (empty for ours or a non-module)."""
    if isinstance(model, DFlashDraftModel) or not isinstance(model, nn.Module):
        return set()
    return set(inspect.signature(model.forward).parameters)


def is_zlab_drafter(model: Any) -> bool:
    """True for an instance of z-lab's remote-code drafter class (loaded with `trust_remote_code=True`)."""
    params = _foreign_forward_params(model)
    return "target_hidden" in params and "noise_embedding" in params


def is_remote_copy_of_ours(model: Any) -> bool:
    """True for our `DFlashDraftModel` loaded from a saved folder with `trust_remote_code=True` (another class)."""
    params = _foreign_forward_params(model)
    return type(model).__name__ == DFlashDraftModel.__name__ and "context_hidden_states" in params


def is_dflash_drafter(model: Any) -> bool:
    """True for our drafter (also as remote code), an adapted one, or a z-lab remote-code instance."""
    return (
        isinstance(model, DFlashDraftModel | ZLabDrafterAdapter)
        or is_remote_copy_of_ours(model)
        or is_zlab_drafter(model)
    )


def as_native_drafter(model: nn.Module) -> DFlashDraftModel | ZLabDrafterAdapter:
    """Our drafter as is (also as remote code); a z-lab instance wrapped once (the adapter is cached on it)."""
    if isinstance(model, DFlashDraftModel | ZLabDrafterAdapter) or is_remote_copy_of_ours(model):
        return model
    if not is_zlab_drafter(model):
        raise TypeError(f"{type(model).__name__} is not a DFlash drafter.")
    adapter = model.__dict__.get("_dflash_adapter")
    if adapter is None:
        adapter = ZLabDrafterAdapter(model)
        model.__dict__["_dflash_adapter"] = adapter
    return adapter
