"""Quantized targets: load a target through Transformers' quantization integrations, and probe its numerics.

A DFlash drafter trained on the full-precision target drafts for a quantized copy of it as is: the drafter reads the
target's hidden states and its (unquantized) embedding and LM head, and the pair check's fingerprint (norms of 32
embedding rows, `hub.target_fingerprint`) is the same for both. Lossless then means: greedy output identical to
plain decoding of the SAME quantized target.

Methods (`QUANTIZATION_METHODS`, what `dflash-bench --quantize` takes):
- `int8-weight-only` (torchao, CPU and CUDA): int8 weights per output channel, float activations and accumulation;
  as batch-invariant as the float dtype it computes in.
- `int8-dynamic` (torchao, CPU and CUDA): int8 weights and per-token int8 activations, integer accumulation (exact).
  The accumulation does not depend on the row count, but rounding activations to int8 magnifies the float noise
  upstream of each linear layer (attention and norms of a 16-token forward versus a 1-token one), so a near tie
  can flip: `probe_batch_variance` measures it and the bench counts the mismatches.
- `int4-weight-only` (torchao, CUDA, bfloat16) and `bnb-4bit` (bitsandbytes NF4, CUDA): the GPU 4-bit paths.
- `paroquant` (z-lab's ParoQuant, CUDA only): a checkpoint quantized beforehand by `paroquant`'s optimizer; it
  cannot be quantized at load time, so it is loaded from its folder (`--target FOLDER`, no `--quantize`).

    target = load_quantized_target("path/to/target", "int8-weight-only", dtype=torch.float32, device="cpu")
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from .quiet_torchao import mute_torchao_import_noise


@dataclass(frozen=True)
class QuantizationMethod:
    """One way to quantize a target at load time.

    Attributes:
        name: what `--quantize` takes.
        package: the Python package it needs (import name); pip_name: what to `pip install`.
        devices: device types it runs on ("cpu", "cuda").
        build: `build(dtype) -> quantization_config` passed to `from_pretrained(quantization_config=...)`.
        note: one line on its numerics, printed by the bench.
        dtypes: the float dtypes its kernels take (None: any).
    """

    name: str
    package: str
    pip_name: str
    devices: tuple[str, ...]
    build: Callable[[torch.dtype], Any]
    note: str
    dtypes: tuple[torch.dtype, ...] | None = None


def _torchao_config(kind: str) -> Callable[[torch.dtype], Any]:
    def build(dtype: torch.dtype) -> Any:
        from transformers import TorchAoConfig

        quant = importlib.import_module("torchao.quantization")
        configs = {
            "int8-weight-only": lambda: quant.Int8WeightOnlyConfig(),
            "int8-dynamic": lambda: quant.Int8DynamicActivationInt8WeightConfig(),
            "int4-weight-only": lambda: quant.Int4WeightOnlyConfig(
                group_size=128, int4_packing_format="tile_packed_to_4d"
            ),
        }
        return TorchAoConfig(configs[kind]())

    return build


def _bnb_4bit(dtype: torch.dtype) -> Any:
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)


QUANTIZATION_METHODS: dict[str, QuantizationMethod] = {
    m.name: m
    for m in (
        QuantizationMethod(
            "int8-weight-only", "torchao", "torchao", ("cpu", "cuda"), _torchao_config("int8-weight-only"),
            "int8 weights, float activations and accumulation: as batch-invariant as the float dtype",
        ),
        QuantizationMethod(
            "int8-dynamic", "torchao", "torchao", ("cpu", "cuda"), _torchao_config("int8-dynamic"),
            "int8 weights and per-token int8 activations, integer accumulation; activation rounding magnifies "
            "float noise, so 1-row and 16-row forwards can differ",
        ),
        QuantizationMethod(
            "int4-weight-only", "torchao", "torchao", ("cuda",), _torchao_config("int4-weight-only"),
            "int4 weights (group 128, tinygemm), bfloat16 activations", (torch.bfloat16,),
        ),
        QuantizationMethod(
            "bnb-4bit", "bitsandbytes", "bitsandbytes", ("cuda",), _bnb_4bit,
            "bitsandbytes NF4 weights, dequantized to the compute dtype per matmul",
        ),
    )
}  # fmt: skip
PRE_QUANTIZED_ONLY = {
    "paroquant": "ParoQuant checkpoints are made by `paroquant`'s optimizer (calibration on a CUDA GPU) and load from "
    "their folder: pass it as --target (needs `pip install 'paroquant[transformers]'` and CUDA)."
}
# Packages whose Transformers quantizer registers itself on import (out-of-tree quantizers).
_REGISTERING_IMPORTS = {"paroquant": "paroquant.inference.backends.transformers.quantizer"}


def quantization_method(name: str) -> QuantizationMethod:
    """The registered method `name`; a ValueError lists the valid names (and says how ParoQuant loads)."""
    if name in PRE_QUANTIZED_ONLY:
        raise ValueError(f"--quantize {name}: {PRE_QUANTIZED_ONLY[name]}")
    method = QUANTIZATION_METHODS.get(name)
    if method is None:
        raise ValueError(f"Unknown quantization method {name!r}; valid: {', '.join(QUANTIZATION_METHODS)}.")
    return method


def _import_quietly(package: str) -> None:
    """Imports `package`, with its import noise muted (see `quiet_torchao`)."""
    mute_torchao_import_noise()
    importlib.import_module(package)


def check_available(method: QuantizationMethod, device: torch.device | str) -> None:
    """Raises an ImportError (package missing) or a ValueError (device not supported) naming the fix."""
    device_type = torch.device(device).type
    if device_type not in method.devices:
        raise ValueError(
            f"Quantization {method.name!r} runs on {' or '.join(method.devices)}, not on {device_type}; "
            f"on this device use one of: {', '.join(available_methods(device_type)) or 'none'}."
        )
    if importlib.util.find_spec(method.package) is None:
        raise ImportError(
            f"Quantization {method.name!r} needs the `{method.pip_name}` package: `pip install {method.pip_name}` "
            "(with `--no-deps` when pip would replace your torch), or `make setup`."
        )
    _import_quietly(method.package)


def available_methods(device_type: str) -> list[str]:
    """The method names that run on `device_type` (installed or not)."""
    return [m.name for m in QUANTIZATION_METHODS.values() if device_type in m.devices]


def load_quantized_target(
    path: str | Path, method: str | None, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> PreTrainedModel:
    """The causal LM in folder `path`, quantized at load time by `method` through Transformers' integration, or
    (`method=None`) loaded as the folder was saved quantized (torchao, bitsandbytes, ParoQuant).

    Raises:
        ValueError: unknown method, ParoQuant asked at load time, or a device the method does not run on.
        ImportError: the method's package is not installed.
    """
    device = torch.device(device)
    kwargs: dict[str, Any] = {"device_map": str(device)} if device.type == "cuda" else {}
    if method is None:
        if prepare_pre_quantized(path) is None:
            raise ValueError(f"{path} is not saved quantized (no quantization_config in config.json); pass a method.")
    else:
        spec = quantization_method(method)
        check_available(spec, device)
        if spec.dtypes is not None and dtype not in spec.dtypes:
            raise ValueError(
                f"Quantization {method!r} computes in {spec.dtypes[0]}, not {dtype}: use --dtype bfloat16."
            )
        kwargs["quantization_config"] = spec.build(dtype)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, trust_remote_code=False, **kwargs)
    return model.eval() if device.type == "cuda" else model.to(device).eval()


def prepare_pre_quantized(path: str | Path) -> str | None:
    """For a folder saved quantized: its `quant_method` (after importing what registers its quantizer), else None.

    Raises:
        ImportError: the folder was quantized by a package that is not installed.
    """
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return None
    import json

    recorded = json.loads(config_file.read_text()).get("quantization_config") or {}
    name = recorded.get("quant_method")
    package = {"torchao": "torchao", "bitsandbytes": "bitsandbytes", "paroquant": "paroquant"}.get(name)
    if package is not None:
        if importlib.util.find_spec(package) is None:
            extra = "'paroquant[transformers]'" if package == "paroquant" else package
            raise ImportError(f"{path} is saved quantized with {name}; install it: `pip install {extra}`.")
        _import_quietly(_REGISTERING_IMPORTS.get(package, package))
    return name


def quantization_of(model: PreTrainedModel) -> str | None:
    """A short description of how `model` is quantized (e.g. "torchao Int8WeightOnlyConfig"), None when it is not."""
    config = getattr(model.config, "quantization_config", None)
    if config is None:
        return None
    if isinstance(config, dict):
        return str(config.get("quant_method"))
    quant_type = getattr(config, "quant_type", None)
    method = getattr(config, "quant_method", "quantized")
    method = getattr(method, "value", method)
    return f"{method} {type(quant_type).__name__}" if quant_type is not None else str(method)


def dense(weight: torch.Tensor) -> torch.Tensor:
    """A plain float tensor of `weight` (torchao tensor subclasses are dequantized), for reading, not computing."""
    dequantize = getattr(weight, "dequantize", None)
    if type(weight) not in (torch.Tensor, torch.nn.Parameter) and callable(dequantize):
        return dequantize()
    return weight


@dataclass
class BatchVariance:
    """How the target's logits for the same positions differ between one forward of `rows` tokens and `rows`
    forwards of one token each (what verification and AR decoding compute).

    Attributes:
        rows: the block length compared.
        argmax_flips: positions whose greedy token differs between the two (each makes DFlash differ from AR).
        max_abs_diff: the largest absolute logit difference.
    """

    rows: int
    argmax_flips: int
    max_abs_diff: float

    @property
    def invariant(self) -> bool:
        """True when no greedy token flips and the logits agree to float32 rounding noise (`INVARIANT_ATOL`)."""
        return self.argmax_flips == 0 and self.max_abs_diff <= INVARIANT_ATOL

    def describe(self) -> str:
        """One line for a report."""
        verdict = "batch-invariant" if self.invariant else "BATCH-VARIANT"
        return (
            f"{verdict}: a {self.rows}-token forward and {self.rows} 1-token forwards differ by up to "
            f"{self.max_abs_diff:.2g} in the logits; greedy token flips here: {self.argmax_flips}/{self.rows}"
        )


# float32 rounding differences between a 16-row and a 1-row forward stay near 1e-5 on these models; bfloat16 and
# dynamic activation quantization move logits by 1e-2 and more, enough to flip near ties on some prompts.
INVARIANT_ATOL = 1e-3


@torch.inference_mode()
def probe_batch_variance(target: PreTrainedModel, input_ids: torch.Tensor, rows: int = 16) -> BatchVariance:
    """Compares the logits of the last `rows` positions of `input_ids` (1, P) computed in one forward after the
    prefix with those computed one token at a time, both on a KV cache of the prefix (see [`BatchVariance`])."""
    from .compat import cache_kwarg

    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] <= rows:
        raise ValueError(f"probe_batch_variance needs (1, P) ids with P > {rows}, got {tuple(input_ids.shape)}.")
    prefix, block = input_ids[:, :-rows], input_ids[:, -rows:]
    name = cache_kwarg(target.forward)

    def prefilled() -> DynamicCache:
        cache = DynamicCache(config=target.config)
        target(prefix, use_cache=True, **{name: cache})
        return cache

    together = target(block, use_cache=True, **{name: prefilled()}).logits[0].float()  # (rows, V)
    cache = prefilled()
    alone = torch.cat(
        [target(block[:, i : i + 1], use_cache=True, **{name: cache}).logits[0].float() for i in range(rows)]
    )  # (rows, V)
    flips = int((together.argmax(-1) != alone.argmax(-1)).sum())
    return BatchVariance(rows, flips, float((together - alone).abs().max()))
