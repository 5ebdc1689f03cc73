"""The resume rule: a resumed run continues the run that wrote the checkpoint, exactly, or is refused.

Settings that change what is trained (optimiser, schedule, data, anchors, the drafter's shape) must equal the ones
recorded in the checkpoint; a difference is refused with the flags' names and the two ways on: a new `--work-dir`
(start over), or `--work-dir NEW --init-from <checkpoint>` (continue from its weights under the new settings, with
a fresh optimiser and schedule). Settings that only change bookkeeping (`RESUME_FREE`) may differ and take effect.
`train_log.jsonl` is cut back to the checkpoint's step, so the log holds one record per step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from .arguments import TRAIN_FLAGS

# TrainConfig fields that may differ on resume: where and how often to log, evaluate and save, when to stop,
# and gradient checkpointing (the same gradients, recomputed).
RESUME_FREE = frozenset(
    {
        "output_dir",
        "stop_after",
        "log_every",
        "eval_every",
        "save_every",
        "keep_checkpoints",
        "eval_max_new_tokens",
        "gradient_checkpointing",
    }
)
# Drafter config field -> the dflash-train flag that sets it.
SHAPE_FLAGS = {
    "block_size": "--block-size",
    "num_hidden_layers": "--draft-layers",
    "num_features": "--target-features",
    "mask_token_id": "--mask-token-id",
    "target_layer_ids": "--target-layers",
}
_FLAG_OF_FIELD = {field: "--" + dest.replace("_", "-") for dest, field in TRAIN_FLAGS.items()}


def refuse(checkpoint: Path, differences: dict[str, tuple[Any, Any]]) -> None:
    """Raises the resume rule's ValueError for `differences` (flag -> (value now, value in the checkpoint))."""
    listed = ", ".join(f"{flag} {now!r} (the run: {then!r})" for flag, (now, then) in differences.items())
    work_dir = checkpoint.parent.parent
    raise ValueError(
        f"{work_dir} holds a run to resume ({checkpoint.name}), and these settings differ from it: {listed}. A resumed "
        "run continues that run exactly, so they are refused rather than ignored. Either rerun with the run's "
        "settings, or start a new run with a new --work-dir, or continue from its weights under the new settings: "
        f"--work-dir NEW --init-from {checkpoint} (a fresh optimizer and schedule)."
    )


def check_train_config(checkpoint: Path, saved: dict[str, Any], current: dict[str, Any], sequences: int) -> None:
    """Refuses to resume `checkpoint` (its trainer state `saved`) under another TrainConfig or data set size."""
    recorded = saved.get("config") or {}
    differences = {
        _FLAG_OF_FIELD.get(k, k): (v, recorded[k])
        for k, v in current.items()
        if k not in RESUME_FREE and k in recorded and recorded[k] != v
    }
    before = (saved.get("data") or {}).get("sequences")
    if before is not None and before != sequences:
        differences["training sequences (--responses, --max-sequences, --max-seq-len)"] = (sequences, before)
    if differences:
        refuse(checkpoint, differences)


def check_drafter_config(checkpoint: Path, saved: PretrainedConfig, current: PretrainedConfig) -> None:
    """Refuses to resume `checkpoint` (drafter config `saved`) with a drafter of another shape."""
    differences = {
        flag: (getattr(current, field), getattr(saved, field))
        for field, flag in SHAPE_FLAGS.items()
        if getattr(current, field) != getattr(saved, field)
    }
    if differences:
        refuse(checkpoint, differences)


def check_shape_flags(checkpoint: Path, saved: PretrainedConfig, flags: dict[str, int | list[int] | None]) -> None:
    """Refuses command-line drafter-shape flags (`SHAPE_FLAGS` field -> value, None: not given) that differ from
    the checkpoint's drafter config `saved`."""
    differences = {
        SHAPE_FLAGS[field]: (value, getattr(saved, field))
        for field, value in flags.items()
        if value is not None and value != getattr(saved, field)
    }
    if differences:
        refuse(checkpoint, differences)


def trim_log(path: Path, step: int) -> int:
    """Drops the records after `step` (and a cut-off last line) from a `train_log.jsonl`, so that a run resumed
    from `step` logs each later step once; returns how many records were dropped."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            record = json.loads(line) if line.endswith("\n") else None
        except json.JSONDecodeError:
            record = None
        if record is None or (record.get("step") or 0) > step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        staging = path.with_name(path.name + ".tmp")
        staging.write_text("".join(kept), encoding="utf-8")
        os.replace(staging, path)
    return dropped
