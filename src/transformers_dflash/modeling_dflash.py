"""DFlashDraftModel: a block-diffusion drafter conditioned on a target model's hidden states.

The drafter has no embedding and no LM head of its own: its input is the target's embedding of
`[last verified token, MASK x (block_size - 1)]`, its output (after its own `norm`) goes through the target's
`lm_head`. Hidden states of a few target layers are concatenated, projected by `fc` and normed by `hidden_norm`,
then injected as extra keys/values into every draft layer (each layer's own `k_proj`/`v_proj`, `k_norm`, RoPE at
the context tokens' absolute positions). Queries come from the block only; attention is bidirectional.

Parameter names are those of the published z-lab checkpoints (`layers.{i}.self_attn.q_proj`, `fc`, `hidden_norm`,
`norm`, ...), so those load with no missing or unexpected keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    eager_attention_forward,
    rotate_half,
)

from .checkpoint_checks import check_finite, check_path, check_weights_cover, weight_shapes
from .compat import model_output
from .configuration_dflash import DFlashConfig
from .draft_vocab import check_draft_vocab, load_draft_vocab, save_draft_vocab


def hidden_state_indices(target_layer_ids: list[int]) -> list[int]:
    """Indices into Transformers' `hidden_states` tuple for 0-based target layers: index 0 is the embeddings."""
    return [i + 1 for i in target_layer_ids]


def extract_context_features(
    hidden_states: tuple[torch.Tensor | None, ...], target_layer_ids: list[int]
) -> torch.Tensor:
    """(b, n, F * H) drafter context from a target output's `hidden_states` (full tuple, or the one Transformers
    returns for `output_hidden_states=hidden_state_indices(ids)`, with None at the other indices)."""
    return torch.cat([hidden_states[i] for i in hidden_state_indices(target_layer_ids)], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE for `x` (b, heads, t, d) with the LAST t rows of `cos`/`sin` (b, T, d), T >= t."""
    t = x.shape[-2]
    cos, sin = cos[:, None, -t:], sin[:, None, -t:]
    return x * cos + rotate_half(x) * sin


def additive_attention_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive form of a bool mask (True = attend) that eager attention adds to its scores: 0 where True,
    the dtype's lowest value where False."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def layer_attention_mask(
    attention_mask: torch.Tensor | None,
    q_len: int,
    kv_len: int,
    sliding_window: int | None,
    additive_dtype: torch.dtype | None,
) -> torch.Tensor | None:
    """The (b, 1, q, kv) mask one layer needs, or None when every query may see every key.

    Keys are the contiguous run of positions that ends with the block, so query i sits at key index
    `kv_len - q_len + i` and a sliding window keeps keys with `(kv_len - q_len + i) - j < window`.
    `attention_mask` is None, a 2D key-padding mask (b, >= kv) with 1 = keep, or a 4D mask (b, 1, q, >= kv)
    (bool True = attend, or additive float) whose last `kv_len` columns are used. Returns bool, or an
    additive mask of `additive_dtype` when given (eager attention adds it to the scores).
    """
    mask = None
    if attention_mask is not None:
        if attention_mask.dim() == 2:
            mask = attention_mask[:, None, None, -kv_len:].bool()
        elif attention_mask.dtype == torch.bool:
            mask = attention_mask[..., -kv_len:]
        else:
            mask = attention_mask[..., -kv_len:] == 0
    if sliding_window is not None and kv_len > sliding_window:
        device = attention_mask.device if attention_mask is not None else None
        query_at = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]  # (q, 1)
        window = (query_at - torch.arange(kv_len, device=device)[None, :]) < sliding_window  # (q, kv)
        mask = window[None, None] if mask is None else mask & window
    if mask is None or additive_dtype is None:
        return mask
    return additive_attention_mask(mask, additive_dtype)


class DFlashAttention(nn.Module):
    """Block queries attending bidirectionally to [cached context, new context, block] keys/values."""

    def __init__(self, config: DFlashConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = False
        is_sliding = config.layer_types[layer_idx] == "sliding_attention"
        self.sliding_window = config.sliding_window if is_sliding else None
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        b, q_len, _ = hidden_states.shape  # (b, q, H); context: (b, n, H)
        kv_input = torch.cat([context, hidden_states], dim=1)  # (b, n + q, H)
        query = self.q_norm(self.q_proj(hidden_states).view(b, q_len, -1, self.head_dim)).transpose(1, 2)
        key = self.k_norm(self.k_proj(kv_input).view(b, kv_input.shape[1], -1, self.head_dim)).transpose(1, 2)
        value = self.v_proj(kv_input).view(b, kv_input.shape[1], -1, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings  # (b, n + q, d)
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)  # (b, heads, q | n + q, d)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)  # (b, kv_heads, past + n + q, d)

        if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):  # a flex BlockMask (training)
            implementation, mask = "flex_attention", attention_mask
        else:
            implementation = self.config._attn_implementation or "sdpa"
            additive = query.dtype if implementation == "eager" else None
            mask = layer_attention_mask(attention_mask, q_len, key.shape[-2], self.sliding_window, additive)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        output, _ = attention(
            self,
            query,
            key,
            value,
            mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            is_causal=False,
            **kwargs,
        )
        return self.o_proj(output.reshape(b, q_len, -1))


class DFlashDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm decoder layer: KV-injected attention then a SwiGLU MLP, each with a residual."""

    def __init__(self, config: DFlashConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        attended = self.self_attn(
            self.input_layernorm(hidden_states),
            context,
            position_embeddings,
            attention_mask,
            past_key_values,
            **kwargs,
        )
        hidden_states = hidden_states + attended
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class DFlashPreTrainedModel(PreTrainedModel):
    """Weights initialisation and capability flags shared by DFlash drafters."""

    config_class = DFlashConfig
    config: DFlashConfig
    base_model_prefix = "model"
    main_input_name = "noise_embeds"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DFlashDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = False
    _supports_attention_backend = True


class DFlashDraftModel(DFlashPreTrainedModel):
    """The DFlash drafter: drafts a whole block of tokens in one forward pass.

    This is the class a checkpoint folder ships as remote code (`AutoModel.from_pretrained(path,
    trust_remote_code=True)` works without this package), so this file imports only its shipped neighbours. The
    package's `transformers_dflash.DFlashDraftModel` extends it with `spec_generate` and with a `save_pretrained`
    that writes the remote code. Load published z-lab checkpoints or our own with `from_pretrained(path)`
    (safetensors only, unless `allow_pickle=True`).
    """

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__(DFlashConfig.from_config(config))
        config = self.config
        self.layers = nn.ModuleList([DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.fc = nn.Linear(config.num_features * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.gradient_checkpointing = False
        # token ids it may draft (`draft_vocab.py`); None: the target's whole vocabulary. Kept out of the state dict
        self.register_buffer("draft_vocab", None, persistent=False)
        self.post_init()

    @property
    def block_size(self) -> int:
        """Tokens per drafted block (anchor included)."""
        return self.config.block_size

    @property
    def mask_token_id(self) -> int | None:
        """Token id filling the masked block slots."""
        return self.config.mask_token_id

    def set_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Restricts drafting to token ids `ids` (sorted and deduplicated here; None: the whole vocabulary)."""
        device = self.fc.weight.device
        self.draft_vocab = None if ids is None else check_draft_vocab(ids, self.config.vocab_size).to(device)

    @property
    def target_layer_ids(self) -> list[int]:
        """0-based target layers read as context (Transformers' `hidden_states[i + 1]`)."""
        return self.config.target_layer_ids

    def project_context(self, context_hidden_states: torch.Tensor) -> torch.Tensor:
        """(b, n, F * H) concatenated target features -> (b, n, H) injected context."""
        return self.hidden_norm(self.fc(context_hidden_states.to(self.fc.weight.dtype)))

    def forward(
        self,
        noise_embeds: torch.Tensor,
        context_hidden_states: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        r"""Draft one block per row.

        Args:
            noise_embeds: (b, q, H) target embeddings of `[anchor, MASK, ...]` (q = block size at inference; the
                training forward packs many blocks of one sequence here).
            context_hidden_states: (b, n, F * H) target features of the n context tokens new since the cache
                (concatenated over `target_layer_ids`); None or n = 0 when nothing is new.
            position_ids: (b, n + q) absolute positions of the new context tokens then the block; defaults to
                consecutive positions after the cache.
            attention_mask: None (all keys visible), a 2D key-padding mask (b, past + n + q), a 4D mask
                (b, 1, q, past + n + q), bool (True = attend) or additive, or a flex attention `BlockMask` over
                (q, n + q) (training; runs `flex_attention`, no cache, no sliding window).
            past_key_values / cache: a Transformers `Cache` holding the context keys/values of earlier steps
                (Transformers 5.23 passes `past_key_values`, 5.24+ `cache`; both are accepted). The block's own
                keys/values are appended too; the caller drops them before the next step.

        Returns:
            `BaseModelOutputWithPast` whose `last_hidden_state` (b, q, H) is normed and ready for the target's
            `lm_head`.
        """
        if past_key_values is not None and cache is not None and past_key_values is not cache:
            raise ValueError("Pass the drafter cache once, as `cache` or as `past_key_values`, not both.")
        cache = cache if cache is not None else past_key_values
        b, q_len, _ = noise_embeds.shape
        if context_hidden_states is None:
            context_hidden_states = noise_embeds.new_zeros(b, 0, self.fc.in_features)
        if context_hidden_states.shape[-1] != self.fc.in_features:
            raise ValueError(
                f"context_hidden_states has width {context_hidden_states.shape[-1]}, expected "
                f"{self.fc.in_features} = {self.config.num_features} target layers x hidden {self.config.hidden_size}; "
                f"read `hidden_states[i + 1]` for i in target_layer_ids={self.target_layer_ids} and concatenate them."
            )
        context = self.project_context(context_hidden_states)  # (b, n, H)
        n_new = context.shape[1] + q_len
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(past, past + n_new, device=noise_embeds.device).expand(b, -1)
        if position_ids.shape[-1] != n_new:
            raise ValueError(
                f"position_ids covers {position_ids.shape[-1]} tokens; it must cover the {context.shape[1]} new "
                f"context tokens followed by the {q_len} block tokens."
            )
        hidden_states = noise_embeds.to(self.fc.weight.dtype)  # (b, q, H)
        position_embeddings = self.rotary_emb(hidden_states, position_ids.expand(b, -1))  # 2 x (b, n + q, d)
        for layer in self.layers:
            hidden_states = layer(hidden_states, context, position_embeddings, attention_mask, cache, **kwargs)
        return model_output(self.norm(hidden_states), cache)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, *args: Any, **kwargs: Any) -> DFlashDraftModel:
        """Loads a z-lab-layout or our own checkpoint; safetensors only unless `allow_pickle=True` is passed.

        A local folder is checked before anything is allocated (config, weight file header, every tensor the config
        needs, see `checkpoint_checks`) and the loaded weights must be finite.
        """
        allow_pickle = kwargs.pop("allow_pickle", False)
        if not allow_pickle:
            kwargs.setdefault("use_safetensors", True)
        folder = check_path(pretrained_model_name_or_path)
        if folder is not None:
            cls._check_folder(folder, kwargs.get("config"), allow_pickle)
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, info) with `output_loading_info=True`
        check_finite(model, str(pretrained_model_name_or_path))
        model.set_draft_vocab(load_draft_vocab(pretrained_model_name_or_path, **kwargs))
        return loaded

    @staticmethod
    def _check_folder(folder: Path, config: DFlashConfig | None, allow_pickle: bool) -> None:
        """Refuses a local checkpoint folder whose config or weight file cannot make this drafter (nothing is
        allocated: the expected shapes come from a model built on the meta device)."""
        config = DFlashConfig.from_config(config) if config is not None else DFlashConfig.from_pretrained(folder)
        found = weight_shapes(folder, allow_pickle)
        if found is None:  # pickle weights, allowed: Transformers reports what they lack
            return
        with torch.device("meta"):
            expected = {name: tuple(t.shape) for name, t in DFlashDraftModel(config).state_dict().items()}
        check_weights_cover(found[0], expected, str(folder / found[1]), config)

    def save_pretrained(self, save_directory: str, *args: Any, **kwargs: Any) -> None:
        """Writes the z-lab layout (config.json, model.safetensors) and `draft_vocab.safetensors` when the drafter
        has a draft vocabulary (the package's class adds the remote code, `transformers_dflash.drafter`)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if self.draft_vocab is not None:
            save_draft_vocab(self.draft_vocab, save_directory)
