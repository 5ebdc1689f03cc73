"""Checks of a drafter checkpoint, run before anything is allocated and after the weights are in memory.

A damaged or mismatched folder fails here with an error that names the file, the field and the fix, instead of
deep inside Transformers or safetensors (or, worse, loading into something silently wrong):

* `check_path`: a local path that does not exist (not a Hub id's "Repo id must be in the form ...");
* `read_config_file` / `check_config_dict`: a missing or unreadable `config.json`, values of the wrong type, no
  `block_size` in any dialect's place (never guessed), `layer_types` that disagree with `num_hidden_layers`;
* `weight_shapes`: a truncated or damaged `model.safetensors` (read from its header, nothing loaded), a folder
  holding pickle weights only (the `allow_pickle=True` opt-in is named);
* `check_weights_cover`: tensors the config needs that the file lacks or holds in another shape;
* `check_finite`: NaN or Inf in the loaded weights (one pass, cheap for a drafter).

This module is shipped in the remote-code folder beside `modeling_dflash.py`, so it imports nothing else of the
package.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import torch
from torch import nn

CONFIG_FILE = "config.json"
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# Fields that must hold integers (a string such as "2" is refused, not parsed: the file is wrong).
INT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "block_size",
    "num_target_layers",
    "mask_token_id",
)
_HEADER_LIMIT = 100 * 2**20  # safetensors' own cap on the JSON header


def looks_local(name: str | os.PathLike) -> bool:
    """Whether `name` can only be a local path (absolute, relative with ./ or ~, or more than one `/`)."""
    text = str(name)
    return Path(text).is_absolute() or text.startswith((".", "~")) or text.count("/") > 1 or "\\" in text


def check_path(name: str | os.PathLike) -> Path | None:
    """The local folder `name` names, None for a Hub id; an OSError when a local-looking path does not exist."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(f"{path} is a file; pass the drafter's folder (the one holding {CONFIG_FILE}).")
    if looks_local(name):
        raise FileNotFoundError(
            f"No drafter folder at {name}: the path does not exist. Check the path (a Hub id looks like 'owner/name')."
        )
    return None


def read_config_file(folder: Path) -> dict[str, Any]:
    """The raw `config.json` of a local drafter folder, or an OSError / ValueError naming the file and the fix."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{folder} has no {CONFIG_FILE}: a drafter folder needs the config it was saved with (save_pretrained "
            f"writes it). Copy it from where the weights came from, or pass config=DFlashConfig(...)."
        )
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{path} is not valid JSON ({error}); the file is damaged: restore it from the checkpoint's source."
        ) from error
    if not isinstance(found, dict):
        raise ValueError(f"{path} holds a JSON {type(found).__name__}, not an object of config fields; restore it.")
    return found


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config_dict(config: dict[str, Any], where: str) -> None:
    """Refuses a drafter config dict (read from `where`) that cannot describe a drafter, naming field and fix."""
    if not config:
        raise ValueError(f"{where} is empty or missing; a drafter needs the config it was saved with.")
    nested = config.get("dflash_config") or {}
    if not isinstance(nested, dict):
        raise ValueError(f"{where}: 'dflash_config' must be an object, got {nested!r}; restore the file.")
    for scope, fields in (("", config), ("dflash_config.", nested)):
        for key in INT_FIELDS:
            value = fields.get(key)
            if value is not None and not _is_int(value):
                raise ValueError(
                    f"{where}: field '{scope}{key}' must be an integer, got {value!r} ({type(value).__name__}); "
                    "write the number without quotes."
                )
    layer_ids = config.get("target_layer_ids", nested.get("target_layer_ids"))
    if layer_ids is not None and not (isinstance(layer_ids, list) and all(_is_int(i) for i in layer_ids)):
        raise ValueError(f"{where}: 'target_layer_ids' must be a list of integers, got {layer_ids!r}.")
    if config.get("block_size") is None and nested.get("block_size") is None:
        raise ValueError(
            f"{where} has no 'block_size' (neither at the top level nor in 'dflash_config'); it is not guessed. "
            'Add the block size the drafter was trained with, e.g. "block_size": 16, at the top level.'
        )
    layers, types = config.get("num_hidden_layers"), config.get("layer_types")
    if layers is not None and isinstance(types, list) and len(types) != layers:
        raise ValueError(
            f"{where}: 'layer_types' lists {len(types)} layers but 'num_hidden_layers' is {layers}; they must agree "
            "with the weights (set num_hidden_layers to the number of `layers.N` the weights hold)."
        )


def read_safetensors_header(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors file's header, after checking that the file holds every byte."""
    size = path.stat().st_size
    damaged = f"{path} is damaged or truncated ({size} bytes)"
    fix = "fetch or save the checkpoint again (a killed download or copy leaves such a file)"
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise OSError(f"{damaged}: no safetensors header; {fix}.")
        (length,) = struct.unpack("<Q", head)
        if length > min(_HEADER_LIMIT, size - 8):
            raise OSError(f"{damaged}: its header claims {length} bytes; {fix}.")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise OSError(f"{damaged}: unreadable header ({error}); {fix}.") from error
    header.pop("__metadata__", None)
    end = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
    if 8 + length + end > size:
        raise OSError(f"{damaged}: its tensors need {8 + length + end} bytes; {fix}.")
    return {name: tuple(t["shape"]) for name, t in header.items()}


def weight_shapes(folder: Path, allow_pickle: bool) -> tuple[dict[str, tuple[int, ...]], str] | None:
    """(tensor name -> shape, file name) of a folder's safetensors weights; None when pickle weights are allowed
    and are all there is. Raises when the weights are missing, damaged, or pickle-only without the opt-in."""
    index = folder / SAFE_INDEX
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        shapes: dict[str, tuple[int, ...]] = {}
        for shard in shards:
            if not (folder / shard).is_file():
                raise FileNotFoundError(f"{folder / shard} (listed in {index.name}) is missing; fetch it again.")
            shapes.update(read_safetensors_header(folder / shard))
        return shapes, SAFE_INDEX
    if (folder / SAFE_WEIGHTS).is_file():
        return read_safetensors_header(folder / SAFE_WEIGHTS), SAFE_WEIGHTS
    pickled = [name for name in PICKLE_WEIGHTS if (folder / name).is_file()]
    if pickled and allow_pickle:
        return None
    if pickled:
        raise OSError(
            f"{folder} holds pickle weights only ({pickled[0]}), which can run code when loaded and are refused by "
            f"default. If you trust the file, pass allow_pickle=True (or convert it: load with allow_pickle=True, "
            "then save_pretrained writes model.safetensors)."
        )
    raise FileNotFoundError(f"{folder} has no {SAFE_WEIGHTS}; a drafter folder needs its weights.")


def check_weights_cover(
    found: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], where: str, config: Any
) -> None:
    """Refuses weights that lack a tensor the config needs, or hold one in another shape (`where`: the file)."""
    missing = sorted(set(expected) - set(found))
    layers_found = {int(name.split(".")[1]) for name in found if name.startswith("layers.")}
    if missing:
        holds = f"the weights hold {len(layers_found)} decoder layers and " if layers_found else ""
        raise ValueError(
            f"{where} lacks {len(missing)} tensors the config needs (e.g. {missing[:3]}): {holds}config.json says "
            f"num_hidden_layers={config.num_hidden_layers}. Fix config.json to describe these weights."
        )
    extra_layers = sorted(i for i in layers_found if i >= config.num_hidden_layers)
    if extra_layers:
        raise ValueError(
            f"{where} holds decoder layers up to {extra_layers[-1]} but config.json says num_hidden_layers="
            f"{config.num_hidden_layers}; set num_hidden_layers to {max(layers_found) + 1}."
        )
    for name, shape in expected.items():
        if found[name] != shape:
            raise ValueError(
                f"{where}: tensor {name} has shape {list(found[name])}, the config implies {list(shape)} "
                f"(hidden_size={config.hidden_size}, {len(config.target_layer_ids)} target layers, heads, "
                "head_dim); the config.json does not describe these weights."
            )


def check_finite(model: nn.Module, where: str) -> None:
    """Refuses a loaded drafter whose weights hold NaN or Inf (`where`: the folder they came from)."""
    bad = [
        name
        for name, tensor in model.state_dict().items()
        if tensor.is_floating_point() and tensor.device.type != "meta" and not bool(torch.isfinite(tensor).all())
    ]
    if bad:
        raise ValueError(
            f"The weights in {where} hold NaN or Inf values in {bad[:5]}: the file is damaged (or the run that "
            "wrote it diverged). Use another checkpoint or fetch the file again."
        )
