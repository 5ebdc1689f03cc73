"""DFlash drafter, remote-code entry point (written by transformers-dflash; regenerate, do not edit).

`AutoModel.from_pretrained(<this folder>, trust_remote_code=True)` loads `DFlashDraftModel` from here.
"""

from .configuration_dflash import DFlashConfig
from .modeling_dflash import DFlashDraftModel

__all__ = ["DFlashConfig", "DFlashDraftModel"]
