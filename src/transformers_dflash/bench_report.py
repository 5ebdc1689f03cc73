"""What `dflash-bench` measured: per-prompt samples, the machine, the summary table, the lossless check, JSON.

Figures, all per (dataset, method variant):
- tokens/s: new tokens / wall seconds of the whole call (prefill included), median over prompt turns.
- speed-up: median over prompt turns of (tokens/s of the variant / tokens/s of `ar` on the same prompt turn); the
  runs of one prompt turn are interleaved, so the pairing cancels slow drifts of the machine.
- tau: committed tokens / verify steps, pooled over prompt turns; the histogram counts steps by committed tokens
  (index n = n tokens; see `bench_methods` for how steps are counted).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

from .bench_methods import BASELINE

SCHEMA_VERSION = 1


@dataclass
class Sample:
    """One timed generation: one method variant on one prompt turn.

    Attributes:
        dataset, prompt_id, turn: which prompt turn (turn 0 is the first user message).
        method: the variant's label (`ar`, `dflash@b16`, ...); block_size: its block size, if any.
        seed: the torch seed set before the call (the same for every variant of a prompt turn).
        prompt_tokens, new_tokens, seconds, tokens_per_second: size and wall time of the call.
        tau, accept_lengths: committed tokens per verify step (None for non-speculative methods).
        output_ids: the new token ids.
        timings: extra seconds the method reports (the engine: time to first token, draft, verify).
        matches_ar: greedy lossless check against `ar` (None: not checked: `ar` itself, sampling, a lossy method).
        first_mismatch: index of the first new token that differs from `ar`'s, when `matches_ar` is False.
    """

    dataset: str
    prompt_id: str
    turn: int
    method: str
    block_size: int | None
    seed: int
    prompt_tokens: int
    new_tokens: int
    seconds: float
    tokens_per_second: float
    tau: float | None
    accept_lengths: list[int] | None
    output_ids: list[int]
    timings: dict[str, float] = field(default_factory=dict)
    matches_ar: bool | None = None
    first_mismatch: int | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        """(dataset, prompt_id, turn): the prompt turn this sample answers."""
        return self.dataset, self.prompt_id, self.turn

    def compare_to(self, reference: list[int]) -> bool:
        """Sets `matches_ar` / `first_mismatch` against `ar`'s ids for the same prompt turn; returns `matches_ar`."""
        ours = self.output_ids
        self.matches_ar = ours == reference
        if not self.matches_ar:
            self.first_mismatch = next(
                (i for i, (a, b) in enumerate(zip(ours, reference, strict=False)) if a != b), None
            )
            if self.first_mismatch is None:  # one is a prefix of the other
                self.first_mismatch = min(len(ours), len(reference))
        return self.matches_ar


@dataclass
class SummaryRow:
    """One line of the table: a method variant on a dataset (`all` pools every dataset)."""

    dataset: str
    method: str
    block_size: int | None
    samples: int
    median_tokens_per_second: float
    speedup: float | None
    tau: float | None
    histogram: list[int] | None
    checked: int
    mismatches: int


def _histogram(samples: list[Sample]) -> list[int] | None:
    lengths = [n for s in samples if s.accept_lengths is not None for n in s.accept_lengths]
    if not lengths:
        return None
    block = samples[0].block_size
    counts = [0] * (max(max(lengths), block or 0) + 1)
    for n in lengths:
        counts[n] += 1
    return counts


def summarize(samples: list[Sample], dataset: str, method: str) -> SummaryRow:
    """The summary of one variant's samples, paired with the `ar` samples among `samples`' prompt turns."""
    own = [s for s in samples if s.method == method]
    reference = {s.key: s.tokens_per_second for s in samples if s.method == BASELINE}
    ratios = [s.tokens_per_second / reference[s.key] for s in own if reference.get(s.key)]
    histogram = _histogram(own)
    steps = sum(histogram) if histogram else 0
    checked = [s for s in own if s.matches_ar is not None]
    return SummaryRow(
        dataset=dataset,
        method=method,
        block_size=own[0].block_size,
        samples=len(own),
        median_tokens_per_second=statistics.median(s.tokens_per_second for s in own),
        speedup=statistics.median(ratios) if ratios else None,
        tau=sum(n * c for n, c in enumerate(histogram)) / steps if steps else None,
        histogram=histogram,
        checked=len(checked),
        mismatches=sum(not s.matches_ar for s in checked),
    )


@dataclass
class BenchResult:
    """A benchmark run: its settings, the machine, every sample, and whether it ran to the end.

    Attributes:
        config: the run's settings (methods, block sizes, generation settings, datasets, command).
        machine: CPU, cores, threads, device and library versions (see `bench.machine_info`).
        methods: the variant labels, in the order they were configured.
        samples: every timed generation, in the order it ran.
        complete: False when the run was interrupted (the samples so far are kept).
    """

    config: dict[str, Any]
    machine: dict[str, Any]
    methods: list[str]
    samples: list[Sample] = field(default_factory=list)
    complete: bool = False

    @property
    def datasets(self) -> list[str]:
        """Datasets with samples, in the order they ran."""
        return list(dict.fromkeys(s.dataset for s in self.samples))

    @property
    def mismatches(self) -> list[Sample]:
        """Samples of lossless methods whose greedy output differs from `ar`'s."""
        return [s for s in self.samples if s.matches_ar is False]

    def summary(self) -> list[SummaryRow]:
        """One row per dataset and variant with samples, then (for several datasets) `all` pooling them."""
        groups = [(d, [s for s in self.samples if s.dataset == d]) for d in self.datasets]
        if len(groups) > 1:
            groups.append(("all", self.samples))
        return [
            summarize(samples, dataset, method)
            for dataset, samples in groups
            for method in self.methods
            if any(s.method == method for s in samples)
        ]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the fields, plus the derived `summary` and `mismatches` (ignored by `from_dict`)."""
        return {
            "schema": SCHEMA_VERSION,
            "config": self.config,
            "machine": self.machine,
            "methods": self.methods,
            "complete": self.complete,
            "summary": [dataclasses.asdict(row) for row in self.summary()],
            "mismatches": [
                {k: getattr(s, k) for k in ("dataset", "prompt_id", "turn", "method", "first_mismatch")}
                for s in self.mismatches
            ],
            "samples": [dataclasses.asdict(s) for s in self.samples],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        """The inverse of [`to_dict`]."""
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"Bench results schema {data.get('schema')!r}; this version reads {SCHEMA_VERSION}.")
        samples = [Sample(**s) for s in data["samples"]]
        return cls(data["config"], data["machine"], list(data["methods"]), samples, bool(data["complete"]))

    def save_json(self, path: str | Path) -> Path:
        """Writes the JSON atomically (a temporary file renamed into place), so a killed run never leaves half."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.tmp")
        staging.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        os.replace(staging, path)
        return path

    @classmethod
    def load_json(cls, path: str | Path) -> BenchResult:
        """Reads what [`save_json`] wrote."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def _histogram_text(histogram: list[int] | None) -> str:
    if not histogram:
        return "-"
    steps = sum(histogram)
    return " ".join(f"{n}:{100 * c / steps:.0f}%" for n, c in enumerate(histogram) if c)


def _lossless_text(row: SummaryRow) -> str:
    if row.method == BASELINE:
        return "reference"
    if not row.checked:
        return "not checked"
    return f"MISMATCH {row.mismatches}/{row.checked}" if row.mismatches else f"ok {row.checked}/{row.checked}"


def format_table(result: BenchResult) -> str:
    """The summary as a Markdown table (what the README and `results.md` show)."""
    lines = [
        "| dataset | method | n | tok/s (median) | speed-up vs ar | tau | greedy == ar | accept length: % of steps |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for row in result.summary():
        speedup = f"{row.speedup:.2f}x" if row.speedup is not None else "-"
        tau = f"{row.tau:.2f}" if row.tau is not None else "-"
        lines.append(
            f"| {row.dataset} | {row.method} | {row.samples} | {row.median_tokens_per_second:.1f} | {speedup} | "
            f"{tau} | {_lossless_text(row)} | {_histogram_text(row.histogram)} |"
        )
    return "\n".join(lines)


def machine_info(device: torch.device) -> dict[str, str | int]:
    """CPU model, core counts, torch threads, device and library versions."""
    from . import __version__

    cpu = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        cpu = next(
            (ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")),
            cpu,
        )
    info: dict[str, str | int] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count() or 0,
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0,
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    info |= {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "transformers_dflash": __version__,
    }
    return info


def format_machine(machine: dict[str, Any]) -> str:
    """One line per machine fact, `key: value`."""
    return "\n".join(f"{key}: {value}" for key, value in machine.items())


def format_mismatches(result: BenchResult) -> str:
    """A loud block naming every greedy output that differs from `ar` (empty string when there is none)."""
    if not result.mismatches:
        return ""
    lines = [f"!!! LOSSLESS CHECK FAILED: {len(result.mismatches)} greedy output(s) differ from ar !!!"]
    lines += [
        f"!!!   {s.method} on {s.dataset}/{s.prompt_id} turn {s.turn}: first differing new token at {s.first_mismatch}"
        for s in result.mismatches
    ]
    return "\n".join(lines)


def write_markdown(result: BenchResult, path: str | Path) -> Path:
    """`results.md`: the command, the machine, the table and any mismatch."""
    path = Path(path)
    parts = [
        "# dflash-bench results",
        f"Command: `{result.config.get('command', '(library call)')}`",
        "```\n" + format_machine(result.machine) + "\n```",
        format_table(result),
    ]
    if not result.complete:
        parts.append("**Interrupted: partial results.**")
    if result.mismatches:
        parts.append("```\n" + format_mismatches(result) + "\n```")
    path.write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    return path
