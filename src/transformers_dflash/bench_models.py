"""The models of a `dflash-bench` run, from local folders only (no remote code): the target and its tokenizer, the
DFlash drafter, and small autoregressive assistants; the embedded pair when no folder is named."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .quantization import load_quantized_target, prepare_pre_quantized

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_target(
    path: str | None, dtype: torch.dtype, device: torch.device, quantize: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The target and tokenizer from a local folder (no remote code), or the embedded SmolLM2 when `path` is None;
    quantized at load time by `quantize` (see `quantization.QUANTIZATION_METHODS`), or as saved in the folder."""
    if quantize is not None or (path is not None and prepare_pre_quantized(path)):
        from .zoo import embedded_target_dir

        folder = path if path is not None else str(embedded_target_dir())
        model = load_quantized_target(folder, quantize, dtype=dtype, device=device)
        return model, AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    if path is None:
        from .zoo import load_embedded_target

        return load_embedded_target(dtype=dtype, device=device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False)
    return model.to(device).eval(), AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def drafter_folder(path: str | None) -> Path:
    """The drafter's folder: `path`, or the shipped embedded drafter when None; it must hold a config.json."""
    from .zoo import embedded_drafter_dir

    folder = Path(path) if path is not None else embedded_drafter_dir()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"No DFlash drafter checkpoint (config.json) in {folder}; pass --drafter FOLDER.")
    return folder


def load_drafter(folder: Path, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The DFlash drafter from a folder in the z-lab layout or ours (safetensors)."""
    from .drafter import DFlashDraftModel

    return DFlashDraftModel.from_pretrained(str(folder), dtype=dtype).to(device).eval()


def load_assistant(
    path: str, tokenizer: PreTrainedTokenizerBase, dtype: torch.dtype, device: torch.device
) -> PreTrainedModel:
    """A small AR draft model from a local folder, refused unless its tokenizer is the target's (no remote code)."""
    if not Path(path).is_dir():
        raise ValueError(f"assisted:MODEL takes a local model folder; {path!r} is not a directory.")
    vocab = AutoTokenizer.from_pretrained(path, trust_remote_code=False).get_vocab()
    if vocab != tokenizer.get_vocab():
        raise ValueError(
            f"The assistant at {path} has another tokenizer than the target; assisted:MODEL needs the same."
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False)
    return model.to(device).eval()
