"""The package's `DFlashDraftModel`: the shipped model class plus what needs the rest of the package.

`modeling_dflash.py` is copied next to the weights as remote code, so it stands alone. This subclass (same name, so
a saved config's `architectures` and `auto_map` name the shipped class) adds z-lab's `spec_generate`, run by the
engine, and a `save_pretrained` that writes the remote code (`hub.write_remote_code`) beside the z-lab layout.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from . import modeling_dflash
from .engine import dflash_generate
from .hub import write_remote_code
from .stats import DFlashStats


class DFlashDraftModel(modeling_dflash.DFlashDraftModel):
    """The DFlash drafter (see [`modeling_dflash.DFlashDraftModel`]), with decoding and export.

    `save_pretrained` writes the z-lab layout plus a `dflash.py` so that `AutoModel.from_pretrained(path,
    trust_remote_code=True)` works without this package's import.
    """

    @torch.inference_mode()
    def spec_generate(
        self,
        target: PreTrainedModel,
        input_ids: torch.LongTensor,
        max_new_tokens: int,
        stop_token_ids: list[int] | None = None,
        temperature: float = 0.0,
        mask_token_id: int | None = None,
        return_stats: bool = False,
    ) -> torch.LongTensor | tuple[torch.LongTensor, DFlashStats]:
        """z-lab's call: speculative decoding of one prompt against `target`, on Transformers 5.x.

        Returns the prompt followed by the new tokens, cut after the first stop token; with `return_stats=True`
        also the engine's statistics (acceptance lengths per step, tau, timings).
        """
        if mask_token_id is not None and mask_token_id != self.config.mask_token_id:
            raise ValueError(
                f"mask_token_id={mask_token_id} differs from the one this drafter was trained with "
                f"({self.config.mask_token_id}); omit it."
            )
        result = dflash_generate(
            target,
            self,
            input_ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stop_token_ids=stop_token_ids,
            return_stats=return_stats,
        )
        return (result.sequences, result.stats) if return_stats else result.sequences

    def save_pretrained(self, save_directory: str, *args: Any, **kwargs: Any) -> None:
        """Writes the z-lab layout (config.json, model.safetensors), the `dflash.py` remote-code entry point and the
        modules it needs, and `draft_vocab.safetensors` when the drafter has a draft vocabulary."""
        super().save_pretrained(save_directory, *args, **kwargs)
        write_remote_code(save_directory)
