"""The engine's compiled steps: the draft and verify forwards captured whole (`fullgraph=True`), as CUDA graphs on CUDA.

Both steps have fixed shapes once compiled (the caches are read in full, the block and verify widths are constants),
so `torch.compile(dynamic=False, fullgraph=True)` captures each as one graph per verify width in use: a graph break
is an error, never a silent slow path (tests/test_compiled_steps.py compiles both on the CPU). On CUDA the default
mode is `"reduce-overhead"`: inductor's kernels replayed as CUDA graphs, whose static inputs are the models'
parameters and the `SlotCache` buffers (marked static where they are allocated), so a replay copies only the few
small per-step tensors (token ids, positions, context features). Everything between the two steps (acceptance,
commit) runs on the device without a host read; the loop reads the host once per step (`engine.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Every engine shares the code objects of `_draft` and `_target_forward`, so each (engine, verify width, cache shape)
# is one more compiled entry on them; Dynamo's default limit (8) would drop a busy process back to eager steps.
_RECOMPILE_LIMIT = 64


def compile_options(device: torch.device, compile: bool | dict[str, Any]) -> dict[str, Any]:
    """`torch.compile` options of the steps: fixed shapes, the whole step as one graph, CUDA graphs on CUDA; a dict
    `compile` adds to or overrides them."""
    options: dict[str, Any] = {"dynamic": False, "fullgraph": True}
    if torch.device(device).type == "cuda":
        options["mode"] = "reduce-overhead"
    return {**options, **(compile if isinstance(compile, dict) else {})}


def compiled_steps(
    draft: Callable[..., Any], verify: Callable[..., Any], device: torch.device, compile: bool | dict[str, Any]
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The draft and verify steps to run: `draft` and `verify` themselves when `compile` is falsy, else compiled."""
    if not compile:
        return draft, verify
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, _RECOMPILE_LIMIT)
    options = compile_options(device, compile)
    steps = [torch.compile(step, **options) for step in (draft, verify)]
    if options.get("mode") in ("reduce-overhead", "max-autotune"):  # CUDA graphs: one engine step per replay
        steps = [_new_step(step) for step in steps]
    return steps[0], steps[1]


def _new_step(step: Callable[..., Any]) -> Callable[..., Any]:
    """`step`, telling CUDA-graph trees before each call that the previous call's outputs have been read (the loop
    reads each step's outputs before the next step), so that their memory is reused instead of re-recording."""

    def run(*args: Any, **kwargs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return step(*args, **kwargs)

    return run
