"""`ZLabDrafterAdapter`: a z-lab remote-code drafter presented through the native DFlash contract."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.modeling_outputs import BaseModelOutputWithPast

from .compat import model_output
from .configuration_dflash import DFlashConfig
from .modeling_dflash import layer_attention_mask


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
        return model_output(hidden, cache)
