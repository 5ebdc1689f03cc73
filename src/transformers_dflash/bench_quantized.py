"""`dflash-bench --quantize METHOD`: the same methods on the full-precision target and on its quantized copy.

The two targets take turns prompt by prompt (full first on even prompts, quantized first on odd ones), each through
`run_benchmark` with its own `ar` as the reference: speed-ups and the greedy identity check of each target are
against AR decoding of that same target. Side by side, per dataset and method:
- tau of both, and the quantized tau as a share of the full-precision one (the acceptance drop);
- tok/s of both, and quantized / full (median over prompt turns of the per-turn ratio): on the `ar` row, whether
  quantization makes plain decoding faster;
- the speed-up over its own `ar` of both;
- for the engine: the cost of a verify step (and of a draft step) in AR steps of the same target, medians over
  prompt turns of (verify seconds / verify steps) / (ar seconds / ar tokens): whether quantization makes
  verification relatively cheaper;
- greedy == ar of both.
Before timing, `probe_batch_variance` says whether each target's greedy tokens differ between a block forward and
one-token forwards, which is what can make a lossless method differ from `ar` (counted in the identity column).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .bench import encode, run_benchmark
from .bench_methods import BASELINE, GenerationSettings
from .bench_plots import write_plots
from .bench_report import BenchResult, SummaryRow, write_markdown
from .drafter_types import as_native_drafter
from .prompts import Prompt
from .quantization import BatchVariance, probe_batch_variance, quantization_of

FULL = "full"


@dataclass
class ComparisonRow:
    """One method on one dataset, full-precision target against quantized target (None: not measured)."""

    dataset: str
    method: str
    tau_full: float | None
    tau_quantized: float | None
    tokens_per_second_full: float
    tokens_per_second_quantized: float
    quantized_over_full: float | None
    speedup_full: float | None
    speedup_quantized: float | None
    verify_in_ar_steps_full: float | None
    verify_in_ar_steps_quantized: float | None
    draft_in_ar_steps_full: float | None
    draft_in_ar_steps_quantized: float | None
    identical_full: str
    identical_quantized: str

    @property
    def tau_share(self) -> float | None:
        """Quantized tau / full-precision tau (the issue's goal: >= 0.95 for int8)."""
        return self.tau_quantized / self.tau_full if self.tau_full and self.tau_quantized is not None else None


@dataclass
class QuantizedComparison:
    """Both runs, the probes and the side-by-side rows."""

    full: BenchResult
    quantized: BenchResult
    method: str
    probes: dict[str, BatchVariance | None]
    rows: list[ComparisonRow]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _step_costs(result: BenchResult, method: str, dataset: str, timing: str) -> float | None:
    """Median over prompt turns of (seconds per engine `timing` step) / (seconds per `ar` token) of one run."""
    ar = {s.key: s.seconds / s.new_tokens for s in result.samples if s.method == BASELINE and s.new_tokens}
    costs = [
        s.timings[timing] / len(s.accept_lengths) / ar[s.key]
        for s in result.samples
        if s.method == method and (dataset == "all" or s.dataset == dataset)
        and timing in s.timings and s.accept_lengths and ar.get(s.key)
    ]  # fmt: skip
    return _median(costs)


def _ratio(full: BenchResult, quantized: BenchResult, method: str, dataset: str) -> float | None:
    """Median over prompt turns of quantized tok/s / full tok/s for one method."""
    speed = {s.key: s.tokens_per_second for s in full.samples if s.method == method}
    ratios = [
        s.tokens_per_second / speed[s.key]
        for s in quantized.samples
        if s.method == method and (dataset == "all" or s.dataset == dataset) and speed.get(s.key)
    ]
    return _median(ratios)


def _identity(row: SummaryRow) -> str:
    if row.method == BASELINE:
        return "reference"
    return f"{row.checked - row.mismatches}/{row.checked}" if row.checked else "-"


def compare_rows(full: BenchResult, quantized: BenchResult) -> list[ComparisonRow]:
    """The side-by-side rows, in the quantized run's summary order."""
    by_key = {(r.dataset, r.method): r for r in full.summary()}
    rows = []
    for q in quantized.summary():
        f = by_key.get((q.dataset, q.method))
        if f is None:
            continue
        cost = {
            (run, timing): _step_costs(res, q.method, q.dataset, timing)
            for run, res in ((FULL, full), ("quantized", quantized))
            for timing in ("verify_s", "draft_s")
        }
        rows.append(
            ComparisonRow(
                q.dataset, q.method, f.tau, q.tau, f.median_tokens_per_second, q.median_tokens_per_second,
                _ratio(full, quantized, q.method, q.dataset), f.speedup, q.speedup,
                cost[FULL, "verify_s"], cost["quantized", "verify_s"], cost[FULL, "draft_s"],
                cost["quantized", "draft_s"], _identity(f), _identity(q),
            )
        )  # fmt: skip
    return rows


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def format_comparison(comparison: QuantizedComparison) -> str:
    """The side-by-side Markdown table, preceded by the batch-variance probes."""
    name = comparison.method
    lines = [
        f"- {run} target: {probe.describe() if probe else 'not probed'}" for run, probe in comparison.probes.items()
    ]
    lines += [
        "",
        f"| dataset | method | tau full | tau {name} (share) | tok/s full | tok/s {name} | {name}/full tok/s "
        f"| speed-up full | speed-up {name} | verify in AR steps full / {name} | draft in AR steps full / {name} "
        f"| greedy == ar full / {name} |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in comparison.rows:
        share = f"{_fmt(r.tau_quantized)} ({_fmt(r.tau_share and 100 * r.tau_share, '.0f', '%')})"
        lines.append(
            f"| {r.dataset} | {r.method} | {_fmt(r.tau_full)} | {share if r.tau_quantized else '-'} "
            f"| {r.tokens_per_second_full:.1f} | {r.tokens_per_second_quantized:.1f} "
            f"| {_fmt(r.quantized_over_full, '.2f', 'x')} | {_fmt(r.speedup_full, '.2f', 'x')} "
            f"| {_fmt(r.speedup_quantized, '.2f', 'x')} "
            f"| {_fmt(r.verify_in_ar_steps_full)} / {_fmt(r.verify_in_ar_steps_quantized)} "
            f"| {_fmt(r.draft_in_ar_steps_full)} / {_fmt(r.draft_in_ar_steps_quantized)} "
            f"| {r.identical_full} / {r.identical_quantized} |"
        )
    return "\n".join(lines)


def _probe(
    target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: Prompt, rows: int
) -> BatchVariance | None:
    input_ids = encode(tokenizer, [{"role": "user", "content": prompt.turns[0]}], target.device)
    return probe_batch_variance(target, input_ids, rows) if input_ids.shape[1] > rows else None


def run_quantized_comparison(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Prompt],
    *,
    full_target: PreTrainedModel,
    drafter: nn.Module | None = None,
    methods: Sequence[str],
    block_sizes: Sequence[int] | None = None,
    settings: GenerationSettings | None = None,
    assistants: dict[str, PreTrainedModel] | None = None,
    seed: int = 0,
    warmup: bool = True,
    out_dir: str | Path | None = None,
    progress: bool = True,
    command: str | None = None,
    method: str | None = None,
) -> QuantizedComparison:
    """Benchmarks `full_target` and its quantized copy `target` prompt by prompt, alternating (see the module doc);
    the other arguments are `run_benchmark`'s; `method` names the quantization in the table (default:
    `quantization_of(target)`). With `out_dir`, each run's files go to
    `out_dir/full` and `out_dir/<method>`, the side-by-side table to `comparison.md` and `comparison.json`."""
    full, quantized = full_target, target
    name = method or (quantization_of(quantized) or "quantized").replace(" ", "-")
    rows = as_native_drafter(drafter).config.block_size if drafter is not None else 16
    probes = {FULL: _probe(full, tokenizer, prompts[0], rows), name: _probe(quantized, tokenizer, prompts[0], rows)}
    common: dict[str, Any] = dict(
        drafter=drafter, methods=methods, block_sizes=block_sizes, settings=settings, assistants=assistants,
        progress=progress, command=command,
    )  # fmt: skip
    results: dict[str, BenchResult] = {}
    turns = 0
    for k, prompt in enumerate(prompts):
        order = [(FULL, full), (name, quantized)][:: 1 if k % 2 == 0 else -1]
        for run, target in order:
            part = run_benchmark(target, tokenizer, [prompt], seed=seed + turns, warmup=warmup and k == 0, **common)
            if run in results:
                results[run].samples += part.samples
                results[run].complete = part.complete
            else:
                results[run] = part
            if not part.complete:
                break
        turns += len(prompt.turns)
        if out_dir is not None:  # kept after each prompt, as `run_benchmark` keeps its own
            for run, result in results.items():
                result.save_json(Path(out_dir) / run / "results.json")
        if not all(r.complete for r in results.values()):
            break
    for run in (FULL, name):  # a run Ctrl-C stopped before it started is empty
        results.setdefault(run, BenchResult(config={}, machine={}, methods=[]))
    for run, result in results.items():
        result.config |= {"prompts": len(prompts), "datasets": list(dict.fromkeys(p.dataset for p in prompts))}
        result.config["batch_variance"] = asdict(probes[run]) if probes[run] else None
    comparison = QuantizedComparison(
        results[FULL], results[name], name, probes, compare_rows(results[FULL], results[name])
    )
    if out_dir is not None:
        _write(comparison, Path(out_dir), command)
    return comparison


def _write(comparison: QuantizedComparison, out: Path, command: str | None) -> None:
    for run, result in ((FULL, comparison.full), (comparison.method, comparison.quantized)):
        result.save_json(out / run / "results.json")
        write_markdown(result, out / run / "results.md")
        write_plots(result, out / run)
    text = f"# dflash-bench: full precision vs {comparison.method}\n\nCommand: `{command or '(library call)'}`\n\n"
    (out / "comparison.md").write_text(text + format_comparison(comparison) + "\n", encoding="utf-8")
    data = {
        "method": comparison.method,
        "probes": {k: asdict(v) if v else None for k, v in comparison.probes.items()},
        "rows": [asdict(r) | {"tau_share": r.tau_share} for r in comparison.rows],
    }
    (out / "comparison.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
