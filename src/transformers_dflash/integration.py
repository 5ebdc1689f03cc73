"""Glue to Transformers' `generate()`: pair checks, foreign-drafter adaptation, `assistant_model=drafter`.

Transformers (>= 5.23) ships a DFlash candidate generator, selected by `speculation_type="dflash"`. Without that
flag, `generate(assistant_model=drafter)` would treat the drafter as a classic autoregressive assistant and fail.
The smallest fix is a thin, version-guarded wrapper around `GenerationMixin.generate`, installed once when
`transformers_dflash` is imported: when `assistant_model` is a DFlash drafter it checks the pair, adapts a z-lab
remote-code drafter, sets `speculation_type="dflash"` and calls the original `generate`. Every other call passes
straight through, unchanged.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast

from .configuration_dflash import DFlashConfig
from .modeling_dflash import DFlashDraftModel, layer_attention_mask

_OUTPUT_CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
_CHECKED_ATTR = (
    "_dflash_checked_pair"  # on the drafter: (weakref to the target, `_pair_state`) of its last passed check
)


def _native_dflash_available() -> bool:
    try:
        from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator  # noqa: F401
    except ImportError:
        return False
    return True


class ZLabDrafterAdapter(nn.Module):
    """Presents a z-lab remote-code `DFlashDraftModel` instance through the native DFlash contract.

    z-lab's class takes `forward(position_ids, attention_mask, noise_embedding, target_hidden, past_key_values,
    use_cache)` and returns the normed hidden states; its config nests `mask_token_id` / `target_layer_ids`.
    The adapter shares the wrapped module's weights (nothing is copied) and exposes the top-level fields.
    """

    def __init__(self, drafter: nn.Module) -> None:
        super().__init__()
        self.drafter = drafter
        config = DFlashConfig.from_config(drafter.config)
        if getattr(drafter, "target_layer_ids", None) is not None:
            config.target_layer_ids = list(drafter.target_layer_ids)
        if getattr(drafter, "block_size", None) is not None:
            config.block_size = int(drafter.block_size)
        self.config = config
        self.generation_config = GenerationConfig()

    @property
    def device(self) -> torch.device:
        """Device of the wrapped drafter's weights."""
        return next(self.drafter.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the wrapped drafter's weights."""
        return next(self.drafter.parameters()).dtype

    def forward(
        self,
        noise_embeds: torch.Tensor,
        context_hidden_states: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """The native contract's call, translated to z-lab's argument names (see [`DFlashDraftModel.forward`])."""
        cache = cache if cache is not None else past_key_values
        if attention_mask is not None and attention_mask.dim() == 2:
            # z-lab's attention hands the mask to the kernel as is; it needs the (b, 1, q, kv) form.
            if bool(attention_mask.all()):
                attention_mask = None
            else:
                kv_len = attention_mask.shape[-1]
                attention_mask = layer_attention_mask(attention_mask, noise_embeds.shape[1], kv_len, None, None)
        hidden = self.drafter(
            position_ids=position_ids,
            attention_mask=attention_mask,
            noise_embedding=noise_embeds.to(self.dtype),
            target_hidden=context_hidden_states.to(self.dtype),
            past_key_values=cache,
            use_cache=cache is not None,
            is_causal=False,
        )
        return BaseModelOutputWithPast(last_hidden_state=hidden, **{_OUTPUT_CACHE_FIELD: cache})


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
    eos = text.eos_token_id if isinstance(text.eos_token_id, list) else [text.eos_token_id]
    if mask == text.pad_token_id or mask in eos:
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
    """What a passed `check_pair` depends on that may change later: dtypes, devices, the embedding's storage (the
    fingerprint's), the drafter's mask id and layer ids."""
    config = as_native_drafter(drafter).config
    t, d, embed = _first_param(target), _first_param(drafter), target.get_input_embeddings().weight
    ids = tuple(config.target_layer_ids or ())
    return same_device, t.dtype, t.device, d.dtype, d.device, embed.data_ptr(), config.mask_token_id, ids


def _check_trained_target(config: DFlashConfig, target: PreTrainedModel) -> None:
    """Refuses a target other than the one recorded in the checkpoint (`dflash_config["target"]`), if any."""
    recorded = (config.dflash_config or {}).get("target")
    if not recorded:
        return
    from .hub import fingerprints_match, target_fingerprint

    expected, actual = recorded.get("fingerprint"), target_fingerprint(target)
    if isinstance(expected, list) and not fingerprints_match(expected, actual):
        raise ValueError(
            f"This drafter was trained for {recorded.get('name_or_path', 'another target')!r}, and this target's "
            "token embedding differs from that one's (the `fingerprint` row norms in `dflash_config.target` of "
            "the drafter's config.json). Load the target it was trained for, or train a drafter for this target "
            "with `dflash-train`."
        )


def _batch_size(args: tuple, kwargs: dict) -> int:
    inputs = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs", kwargs.get("inputs_embeds")))
    return int(inputs.shape[0]) if isinstance(inputs, torch.Tensor) and inputs.dim() >= 2 else 1


def prepare_dflash_generate(target: PreTrainedModel, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The kwargs with which `generate` runs Transformers' DFlash path for `assistant_model=<DFlash drafter>`."""
    if not _native_dflash_available():
        import transformers

        raise ImportError(
            f"transformers {transformers.__version__} has no DFlash generation path; install transformers>=5.23, "
            "or use `transformers_dflash.dflash_generate(target, drafter, input_ids)`."
        )
    kwargs = dict(kwargs)
    generation_config = kwargs.get("generation_config")
    requested = kwargs.get("speculation_type", getattr(generation_config, "speculation_type", None))
    if requested not in (None, "dflash"):
        raise ValueError(f"A DFlash drafter needs speculation_type='dflash', got {requested!r}.")
    kwargs["speculation_type"] = "dflash"
    if _batch_size(args, kwargs) > 1:
        raise ValueError(
            "Transformers' DFlash path decodes one sequence at a time (batch size 1). For batches use "
            "`transformers_dflash.dflash_generate(target, drafter, input_ids, attention_mask=...)`."
        )
    wants_hidden = kwargs.get("output_hidden_states", getattr(generation_config, "output_hidden_states", False))
    if wants_hidden:
        # transformers 5.23/5.24: the DFlash generator overrides `output_hidden_states` with a list of layer
        # indices and the returned `hidden_states` then mixes None entries, which crashes inside `generate`.
        raise ValueError(
            "output_hidden_states=True is not supported with DFlash generation in Transformers; run a separate "
            "target forward on the generated ids to get hidden states."
        )
    drafter = as_native_drafter(kwargs["assistant_model"])
    check_pair(target, drafter, same_device=False)
    kwargs["assistant_model"] = drafter
    return kwargs


def install_generate_hook() -> None:
    """Makes `generate(assistant_model=<DFlash drafter>)` take the DFlash path (idempotent)."""
    original = GenerationMixin.generate
    if getattr(original, "_dflash_hook", False):
        return

    @functools.wraps(original)
    def generate(self: PreTrainedModel, *args: Any, **kwargs: Any) -> Any:
        if is_dflash_drafter(kwargs.get("assistant_model")):
            kwargs = prepare_dflash_generate(self, args, kwargs)
        return original(self, *args, **kwargs)

    generate._dflash_hook = True  # type: ignore[attr-defined]
    GenerationMixin.generate = generate
