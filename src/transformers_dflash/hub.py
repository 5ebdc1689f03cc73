"""Checkpoint export: the remote-code files that make a saved drafter load anywhere.

`save_pretrained` writes `config.json` (z-lab dialect) and `model.safetensors`; this module adds `dflash.py`
(the `auto_map` entry point) and the package modules it needs, copied byte for byte from this package at save
time: the model code has one source of truth and the shipped files are never a hand-kept copy.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
ENTRY_MODULES = ("configuration_dflash", "modeling_dflash")
_RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.(\w+)\s+import", flags=re.MULTILINE)
_ENTRY_POINT = '''"""DFlash drafter, remote-code entry point (written by transformers-dflash; regenerate, do not edit).

`AutoModel.from_pretrained(<this folder>, trust_remote_code=True)` loads `DFlashDraftModel` from here.
"""

from .configuration_dflash import DFlashConfig
from .modeling_dflash import DFlashDraftModel

__all__ = ["DFlashConfig", "DFlashDraftModel"]
'''


def remote_code_modules() -> list[str]:
    """Package modules the drafter's code imports, transitively (what a remote-code folder must contain)."""
    seen: list[str] = []
    todo = list(ENTRY_MODULES)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        source = (PACKAGE_DIR / f"{name}.py").read_text()
        todo.extend(m for m in _RELATIVE_IMPORT.findall(source) if m not in seen)
    return sorted(seen)


def write_remote_code(save_directory: str | Path) -> Path:
    """Writes `dflash.py` and the modules it needs beside `config.json`; returns the path of `dflash.py`."""
    out = Path(save_directory)
    out.mkdir(parents=True, exist_ok=True)
    for name in remote_code_modules():
        shutil.copyfile(PACKAGE_DIR / f"{name}.py", out / f"{name}.py")
    entry = out / "dflash.py"
    entry.write_text(_ENTRY_POINT)
    return entry
