"""Checkpoint export: the remote-code files that make a saved drafter load anywhere.

`save_pretrained` writes `config.json` (z-lab dialect) and `model.safetensors`; this module adds `dflash.py`
(the `auto_map` entry point) and the package modules it needs, copied byte for byte from this package at save
time: the model code has one source of truth and the shipped files are never a hand-kept copy.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import torch
from transformers import PreTrainedModel

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


def target_fingerprint(target: PreTrainedModel) -> str:
    """A short, stable id of a target's token embedding (shape and a few sums), recorded in a drafter's config.

    It tells a drafter's own target from another model with the same shapes, without hashing every weight.
    """
    weight = target.get_input_embeddings().weight.detach().float()
    rows = torch.linspace(0, weight.shape[0] - 1, steps=min(64, weight.shape[0])).long()
    probe = torch.cat([weight[rows].sum(dim=1), weight.sum(dim=0)[:16]]).cpu()
    digest = hashlib.sha256(f"{tuple(weight.shape)}".encode() + probe.round(decimals=3).numpy().tobytes())
    return digest.hexdigest()[:16]
