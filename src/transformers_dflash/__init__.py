"""transformers-dflash: DFlash block-diffusion speculative decoding for Hugging Face Transformers.

Importing the package registers `DFlashConfig` / `DFlashDraftModel` with the Auto classes and lets
`target.generate(**inputs, assistant_model=drafter)` run the DFlash path (see `generate_hook`).
"""

from . import quiet_torchao  # noqa: F401  (first: mutes torchao import noise before Transformers loads it)

# isort: split
from transformers import AutoConfig, AutoModel

from .compat import install_tokenizer_passthrough
from .configuration_dflash import DFlashConfig, default_target_layer_ids
from .custom_generate import fast_generate
from .drafter import DFlashDraftModel
from .engine import dflash_generate
from .generate_hook import install_generate_hook
from .modeling_dflash import extract_context_features, hidden_state_indices
from .pair_check import check_pair

AutoConfig.register(DFlashConfig.model_type, DFlashConfig, exist_ok=True)
AutoModel.register(DFlashConfig, DFlashDraftModel, exist_ok=True)
install_generate_hook()
install_tokenizer_passthrough()

__all__ = [
    "DFlashConfig",
    "DFlashDraftModel",
    "check_pair",
    "default_target_layer_ids",
    "dflash_generate",
    "fast_generate",
    "extract_context_features",
    "hidden_state_indices",
]
__version__ = "0.1.0"
