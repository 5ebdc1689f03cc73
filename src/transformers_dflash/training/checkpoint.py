"""Atomic, resumable training checkpoints on top of `accelerate`'s `save_state` / `load_state`.

A checkpoint `checkpoints/step-00000120/` holds what `Accelerator.save_state` writes (drafter weights, optimizer,
scheduler, the RNG states of every process), the drafter's `config.json` (and `draft_vocab.safetensors` when it has
one), and `trainer_state.json` (step, epoch, wall time, ...). It is written into `step-00000120.tmp/` and renamed
into place only when complete, so a killed run never leaves a half checkpoint that resume would pick up; a folder
damaged afterwards (a file missing or truncated) is named and skipped, and the newest complete one is used.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from transformers import PretrainedConfig

from ..checkpoint_checks import CONFIG_FILE, SAFE_WEIGHTS, read_safetensors_header
from ..draft_vocab import save_draft_vocab

STATE_FILE = "trainer_state.json"
# What a checkpoint must hold to be resumed from: one of each group (accelerate's names, FSDP's sharded ones too).
REQUIRED_FILES = (
    (SAFE_WEIGHTS, "pytorch_model.bin", "pytorch_model_fsdp_0"),
    ("optimizer.bin", "optimizer_0"),
    ("scheduler.bin",),
    (CONFIG_FILE,),
    (STATE_FILE,),
)
_PREFIX = "step-"


def checkpoint_dir(root: str | Path, step: int) -> Path:
    """Folder of the checkpoint taken after `step` optimizer steps."""
    return Path(root) / f"{_PREFIX}{step:08d}"


def incomplete_reason(checkpoint: Path) -> str | None:
    """Why a checkpoint folder cannot be resumed from (a file missing, damaged weights or state), or None."""
    missing = [group[0] for group in REQUIRED_FILES if not any((checkpoint / name).exists() for name in group)]
    if missing:
        return f"{', '.join(missing)} missing"
    try:
        if (checkpoint / SAFE_WEIGHTS).is_file():
            read_safetensors_header(checkpoint / SAFE_WEIGHTS)
        read_state(checkpoint)
    except (OSError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        return str(error)
    return None


def _step_folders(root: Path) -> list[Path]:
    """`step-*` folders under `root` (temporary `.tmp` folders of interrupted saves excluded), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{_PREFIX}*") if p.is_dir() and p.suffix != ".tmp" and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (see `incomplete_reason`; `.tmp` folders are ignored)."""
    return [p for p in _step_folders(Path(root)) if incomplete_reason(p) is None]


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None; newer incomplete ones are named on stderr, skipped."""
    folders = _step_folders(Path(root))
    for folder in reversed(folders):
        reason = incomplete_reason(folder)
        if reason is None:
            return folder
        print(f"dflash-train: skipping the incomplete checkpoint {folder} ({reason}).", file=sys.stderr)
    return None


def read_state(checkpoint: str | Path) -> dict[str, Any]:
    """The `trainer_state.json` of a checkpoint."""
    return json.loads((Path(checkpoint) / STATE_FILE).read_text())


def save_checkpoint(
    accelerator: Accelerator,
    root: str | Path,
    step: int,
    state: dict[str, Any],
    config: PretrainedConfig,
    keep: int | None = None,
    draft_vocab: torch.Tensor | None = None,
) -> Path:
    """Writes a checkpoint atomically (every process must call this); keeps the newest `keep` ones.

    Args:
        accelerator: the run's accelerator (its prepared model, optimizer and scheduler are saved).
        root: the checkpoints folder.
        step: optimizer steps done.
        state: JSON-serialisable trainer state (written as `trainer_state.json`).
        config: the drafter's config, saved beside the weights so export needs nothing else.
        keep: how many checkpoints to keep (None: all).
        draft_vocab: the drafter's draft vocabulary (`draft_vocab.py`), saved beside the weights when set.
    """
    final = checkpoint_dir(root, step)
    staging = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        config.save_pretrained(staging)
        if draft_vocab is not None:
            save_draft_vocab(draft_vocab, staging)
        (staging / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        if keep is not None:
            for old in list_checkpoints(root)[:-keep]:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Accelerator, checkpoint: str | Path) -> dict[str, Any]:
    """Restores model, optimizer, scheduler and RNG states from `checkpoint`; returns its trainer state."""
    accelerator.load_state(str(checkpoint))
    return read_state(checkpoint)
