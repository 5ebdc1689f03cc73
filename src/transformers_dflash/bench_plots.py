"""PNG plots of a benchmark run: speed-up over `ar` per dataset, and the acceptance-length histograms.

Drawn with matplotlib's object API on `Figure` objects (no pyplot, no GUI backend): safe in headless runs.
"""

from __future__ import annotations

from pathlib import Path

from .bench_methods import BASELINE
from .bench_report import BenchResult, SummaryRow


def new_figure(width: float, height: float) -> object:
    """A headless matplotlib `Figure` (constrained layout, 120 dpi); a clear ImportError without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("Plots need matplotlib: pip install 'transformers-dflash[bench]'.") from error
    return Figure(figsize=(width, height), dpi=120, layout="constrained")


def plot_speedup(rows: list[SummaryRow], path: Path) -> Path:
    """Grouped bars: median speed-up over `ar` of each variant (bars) on each dataset (groups)."""
    datasets = list(dict.fromkeys(r.dataset for r in rows))
    methods = list(dict.fromkeys(r.method for r in rows if r.method != BASELINE and r.speedup is not None))
    value = {(r.dataset, r.method): r.speedup for r in rows}
    fig = new_figure(max(5.0, 1.2 * len(datasets) * max(1, len(methods)) ** 0.5 + 2), 3.6)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(methods))
    for j, method in enumerate(methods):
        xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(datasets))]
        heights = [value.get((d, method)) or 0.0 for d in datasets]
        bars = ax.bar(xs, heights, width, label=method)
        ax.bar_label(bars, labels=[f"{h:.2f}" if h else "" for h in heights], fontsize=7, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="ar")
    ax.set_xticks(range(len(datasets)), datasets)
    ax.set_ylabel("speed-up vs ar (median tokens/s ratio)")
    ax.set_title("dflash-bench: speed-up over autoregressive decoding")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path)
    return path


def plot_acceptance(rows: list[SummaryRow], path: Path) -> Path:
    """One panel per dataset: share of verify steps committing n tokens, per speculative variant (tau in legend)."""
    with_hist = [r for r in rows if r.histogram]
    datasets = list(dict.fromkeys(r.dataset for r in with_hist)) or ["(no speculative method)"]
    fig = new_figure(6.0, 2.6 * len(datasets))
    axes = fig.subplots(len(datasets), 1, squeeze=False)[:, 0]
    for ax, dataset in zip(axes, datasets, strict=True):
        panel = [r for r in with_hist if r.dataset == dataset]
        width = 0.8 / max(1, len(panel))
        start = 0 if any(r.histogram[0] for r in panel) else 1  # 0 tokens: only rows that finished early
        for j, row in enumerate(panel):
            steps = sum(row.histogram)
            xs = [n + (j - (len(panel) - 1) / 2) * width for n in range(start, len(row.histogram))]
            shares = [c / steps for c in row.histogram[start:]]
            ax.bar(xs, shares, width, label=f"{row.method} (tau {row.tau:.2f})")
        ax.set_title(dataset, fontsize=9)
        ax.set_xlabel("tokens committed per verify step")
        ax.set_ylabel("share of steps")
        if panel:
            ax.legend(fontsize=7)
    fig.savefig(path)
    return path


def write_plots(result: BenchResult, out_dir: str | Path) -> list[Path]:
    """Writes `speedup.png` and `acceptance.png` into `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = result.summary()
    return [plot_speedup(rows, out_dir / "speedup.png"), plot_acceptance(rows, out_dir / "acceptance.png")]
