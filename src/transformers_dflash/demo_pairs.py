"""The model pairs the demo may serve: an allowlist of names (never paths from a visitor), and their loading.

The embedded pair comes first; the Space's owner adds pairs in ``$DFLASH_DEMO_PAIRS`` (JSON ``{"name": {"target":
"/dir", "drafter": "/dir"}}`` of local folders). Nothing is loaded with remote code; weights are read from
safetensors only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .configuration_dflash import DFlashConfig
from .drafter import DFlashDraftModel
from .pair_check import check_pair
from .zoo import EMBEDDED_DRAFTER_NAME, EMBEDDED_TARGET_NAME, embedded_drafter_dir, load_embedded_target

PAIRS_ENV = "DFLASH_DEMO_PAIRS"
EMBEDDED_PAIR = f"{EMBEDDED_TARGET_NAME} + {EMBEDDED_DRAFTER_NAME}"


@dataclass(frozen=True)
class PairSpec:
    """One allowlisted pair: local target and drafter folders, or both None for the embedded pair."""

    name: str
    target_dir: Path | None = None
    drafter_dir: Path | None = None


def allowed_pairs(environ: Mapping[str, str] | None = None) -> dict[str, PairSpec]:
    """The pairs a visitor may choose: the embedded one first, then those configured in ``$DFLASH_DEMO_PAIRS``.

    Raises:
        ValueError: the variable is not a JSON object of ``name -> {"target": dir, "drafter": dir}`` with existing
            folders holding a ``config.json`` (a configuration error of the Space's owner, reported at startup).
    """
    environ = os.environ if environ is None else environ
    pairs = {EMBEDDED_PAIR: PairSpec(EMBEDDED_PAIR)}
    raw = environ.get(PAIRS_ENV, "").strip()
    if not raw:
        return pairs
    try:
        configured = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"${PAIRS_ENV} is not valid JSON ({exc}).") from exc
    if not isinstance(configured, dict):
        raise ValueError(f'${PAIRS_ENV} must be a JSON object {{"name": {{"target": dir, "drafter": dir}}}}.')
    for name, dirs in configured.items():
        if not name.strip() or name in pairs:
            raise ValueError(f"${PAIRS_ENV}: pair name {name!r} is empty or already taken.")
        if not isinstance(dirs, dict) or set(dirs) != {"target", "drafter"}:
            raise ValueError(f'${PAIRS_ENV}["{name}"] must be {{"target": dir, "drafter": dir}}, got {dirs!r}.')
        paths = {role: Path(str(d)).expanduser().resolve() for role, d in dirs.items()}
        for role, path in paths.items():
            if not (path / "config.json").is_file():
                raise ValueError(f'${PAIRS_ENV}["{name}"]: the {role} folder {path} has no config.json.')
        pairs[name] = PairSpec(name, paths["target"], paths["drafter"])
    return pairs


def pair_problem(spec: PairSpec) -> str | None:
    """Why a pair cannot run as shipped (today: the embedded drafter missing from this build), else None."""
    if spec.drafter_dir is not None:
        return None
    try:
        embedded_drafter_dir()
    except FileNotFoundError as exc:
        return f"The embedded pair is not available in this build: {exc}"
    return None


def default_pair(pairs: Mapping[str, PairSpec]) -> str:
    """The first pair that is available (the embedded pair when it is), else the first one."""
    return next((name for name, spec in pairs.items() if pair_problem(spec) is None), next(iter(pairs)))


def pair_note(pairs: Mapping[str, PairSpec], name: str) -> str:
    """Markdown note under the pair choice: why the chosen pair cannot run, or that the embedded one is missing."""
    problem = pair_problem(pairs[name])
    if problem:
        return f"⚠️ {problem}"
    embedded = pair_problem(pairs[EMBEDDED_PAIR])
    return f"ℹ️ {embedded} Showing **{name}** instead." if embedded else ""


def drafter_block_size(spec: PairSpec) -> int:
    """The block size the pair's drafter was trained with, read from its config (16 if it cannot be read)."""
    try:
        path = spec.drafter_dir or embedded_drafter_dir()
        return int(DFlashConfig.from_pretrained(path).block_size)
    except (OSError, ValueError):
        return 16


@dataclass
class LoadedPair:
    """A target, its tokenizer and its drafter, ready to decode."""

    name: str
    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    drafter: DFlashDraftModel

    @property
    def block_size(self) -> int:
        """The drafter's trained block size (the largest the demo offers)."""
        return int(self.drafter.config.block_size)


def load_pair(spec: PairSpec) -> LoadedPair:
    """Load a pair from local files only: no remote code, safetensors weights, float32 on the CPU."""
    if spec.target_dir is None:
        drafter_dir = embedded_drafter_dir()  # first: it fails fast when the drafter is not in this build
        target, tokenizer = load_embedded_target()
    else:
        safe = dict(local_files_only=True, trust_remote_code=False)
        target = AutoModelForCausalLM.from_pretrained(
            spec.target_dir, dtype=torch.float32, use_safetensors=True, **safe
        )
        tokenizer = AutoTokenizer.from_pretrained(spec.target_dir, **safe)
        drafter_dir = spec.drafter_dir
    drafter = DFlashDraftModel.from_pretrained(drafter_dir, dtype=target.dtype, local_files_only=True)
    check_pair(target.eval(), drafter.eval())
    return LoadedPair(spec.name, target, tokenizer, drafter)
