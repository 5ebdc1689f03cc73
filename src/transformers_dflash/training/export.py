"""Export a trained drafter: z-lab layout (config.json, model.safetensors, dflash.py) plus a model card.

The drafter's config records the target it was trained for in `dflash_config["target"]` (name, shape and
`hub.target_fingerprint`), which the pair check (`pair_check`) uses to refuse another target.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel

from ..configuration_dflash import DFlashConfig
from ..draft_vocab import load_draft_vocab
from ..drafter import DFlashDraftModel
from ..hub import target_fingerprint, write_model_card
from .checkpoint import read_state
from .plots import plot_training_log
from .trainer import LOG_FILE

WEIGHTS_FILE = "model.safetensors"
CURVES_FILE = "training.png"


def record_target(config: DFlashConfig, target: PreTrainedModel, name_or_path: str | None = None) -> dict[str, Any]:
    """Stores the identity of `target` in `config.dflash_config["target"]` and returns it.

    Keys: `name_or_path` (default: the target config's own), `num_hidden_layers`, `hidden_size`, `vocab_size`,
    `fingerprint` (`hub.target_fingerprint`, what the pair check compares).
    """
    text = target.config.get_text_config()
    identity = {
        "name_or_path": name_or_path or getattr(target.config, "_name_or_path", None) or "",
        "num_hidden_layers": text.num_hidden_layers,
        "hidden_size": text.hidden_size,
        "vocab_size": text.vocab_size,
        "fingerprint": target_fingerprint(target),
    }
    config.dflash_config = {**(config.dflash_config or {}), "target": identity}
    return identity


def load_trained_drafter(checkpoint: str | Path) -> DFlashDraftModel:
    """The drafter of a training checkpoint folder (its `config.json`, the weights `accelerate` saved, and its draft
    vocabulary when it has one)."""
    checkpoint = Path(checkpoint)
    weights = checkpoint / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(
            f"{weights} is missing: not a dflash-train checkpoint, or one saved sharded (FSDP); for FSDP, consolidate "
            "it first with `accelerate merge-weights`."
        )
    drafter = DFlashDraftModel(DFlashConfig.from_pretrained(checkpoint))
    drafter.load_state_dict(load_file(weights), strict=True)
    drafter.set_draft_vocab(load_draft_vocab(checkpoint))
    return drafter.eval()


def export_drafter(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    base_model: str,
    dtype: torch.dtype = torch.bfloat16,
    command: str | None = None,
    data: str | None = None,
    license: str = "apache-2.0",
    datasets: list[str] | None = None,
    repo_id: str | None = None,
    card_notes: str | None = None,
    tau: float | None = None,
) -> Path:
    """Writes the drafter of `checkpoint` to `out_dir` in the z-lab layout (in `dtype`) with a model card.

    The card's training facts (steps, epochs, wall time, last measured tau) come from the checkpoint's
    `trainer_state.json` (with the command line and hardware the trainer recorded in `run_info`, unless
    `command` is given); `data` describes the training data; `card_notes` (markdown) ends the card; `tau`, a
    held-out tau measured outside the run (e.g. by `benchmarks/compare_drafters.py`), takes the card's tau field
    over the run's last eval (the "tau by step" row still lists the run's own evals). The run's
    training curves (`plots.plot_training_log` of its `train_log.jsonl`) go beside the weights as `training.png`
    and into the card, where matplotlib is installed.
    """
    state = read_state(checkpoint)
    run_info = dict(state.get("run_info") or {})
    command = command or run_info.pop("command", None)
    drafter = load_trained_drafter(checkpoint).to(dtype)
    drafter.save_pretrained(out_dir)
    evals = state.get("evals") or []
    config = state.get("config", {})
    training = {
        "data": data or "not recorded",
        "optimizer steps": str(state["step"]),
        "epochs": str(config.get("epochs", "?")),
        "sequences per step": str(config.get("batch_size", 1) * config.get("grad_accum", 1)),
        "blocks per sequence": str(config.get("num_anchors", "?")),
        "labels": {"tokens": "the response tokens", "target": "the target's argmax"}.get(config.get("labels"), "?"),
        "wall time": f"{state.get('wall_seconds', 0.0) / 60:.1f} min",
        "tau by step": ", ".join(f"{e['step']}: {e['tau']:.2f}" for e in evals) or "not measured",
        **{str(k): str(v) for k, v in run_info.items() if k != "command"},
    }
    log = Path(checkpoint).parent.parent / LOG_FILE  # <output_dir>/checkpoints/step-N -> <output_dir>/train_log.jsonl
    if log.is_file() and importlib.util.find_spec("matplotlib") is not None:
        plot_training_log(log, Path(out_dir) / CURVES_FILE)
        curves = f"![Training curves: loss, accuracy by block position, held-out tau]({CURVES_FILE})"
        card_notes = f"{curves}\n\n{card_notes or ''}"
    write_model_card(
        out_dir,
        base_model=base_model,
        config=drafter.config,
        repo_id=repo_id,
        license=license,
        tau=tau if tau is not None else (evals[-1]["tau"] if evals else None),
        training=training,
        command=command,
        datasets=datasets,
        notes=card_notes,
    )
    return Path(out_dir)
