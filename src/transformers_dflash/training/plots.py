"""Training curves of a `dflash-train` run, drawn from its `train_log.jsonl`: what a model card shows.

Three panels: the loss by optimizer step (raw and smoothed), the accuracy of each block position over the first
and the last tenth of training, and the real acceptance length tau measured by the periodic evaluations.
Drawn with matplotlib's object API on a `Figure` (no pyplot, no GUI backend).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..bench_plots import new_figure


def read_log(path: str | Path) -> tuple[list[dict], list[dict]]:
    """The `train` and `eval` records of a training log, in order."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("event") == "train"], [r for r in records if r.get("event") == "eval"]


def _mean_accuracy(records: list[dict]) -> list[float]:
    """Mean accuracy of each block position (1..B-1) over `records`; NaN where a position was never supervised
    (e.g. target-argmax labels on text that always leaves the target's greedy path before it)."""
    columns = [
        [a for a in column if a is not None] for column in zip(*(r["acc_by_position"] for r in records), strict=True)
    ]
    return [statistics.fmean(column) if column else float("nan") for column in columns]


def plot_training_log(log_path: str | Path, out_path: str | Path) -> Path:
    """Writes the training-curves PNG of the run whose log is `log_path`; returns `out_path`.

    Raises:
        ValueError: the log holds no `train` record (nothing to plot).
        ImportError: matplotlib is missing (the message gives the pip command).
    """
    train, evals = read_log(log_path)
    if not train:
        raise ValueError(f"{log_path} holds no training records: train first (dflash-train train).")
    fig = new_figure(12.0, 3.4)
    loss_ax, acc_ax, tau_ax = fig.subplots(1, 3)

    steps, losses = [r["step"] for r in train], [r["loss"] for r in train]
    window = max(1, len(losses) // 50)
    smooth = [statistics.fmean(losses[max(0, i - window + 1) : i + 1]) for i in range(len(losses))]
    loss_ax.plot(steps, losses, color="#BBBBBB", linewidth=0.6, label="logged")
    loss_ax.plot(steps, smooth, color="#0072B2", linewidth=1.5, label=f"mean of {window}")
    loss_ax.set_yscale("log")
    loss_ax.set(xlabel="optimizer step", ylabel="weighted block loss", title="loss")
    loss_ax.legend(fontsize=7)

    tenth = max(1, len(train) // 10)
    for records, name, colour in ((train[:tenth], "first", "#E69F00"), (train[-tenth:], "last", "#0072B2")):
        accuracy = _mean_accuracy(records)
        acc_ax.plot(range(1, len(accuracy) + 1), accuracy, marker="o", markersize=3, color=colour,
                    label=f"{name} 10% of steps")  # fmt: skip
    acc_ax.set_xticks(range(1, len(train[0]["acc_by_position"]) + 1, 2))
    acc_ax.set(xlabel="block position k (k-th drafted token)", ylabel="top-1 accuracy", title="accuracy by position")
    acc_ax.set_ylim(0, 1)
    acc_ax.legend(fontsize=7)

    if evals:
        tau_ax.plot([e["step"] for e in evals], [e["tau"] for e in evals], marker="o", color="#009E73")
        for e in evals:
            tau_ax.annotate(f"{e['tau']:.2f}", (e["step"], e["tau"]), textcoords="offset points", xytext=(0, 5),
                            ha="center", fontsize=7)  # fmt: skip
    else:
        tau_ax.text(0.5, 0.5, "no evaluation logged", ha="center", va="center", transform=tau_ax.transAxes)
    tau_ax.set(xlabel="optimizer step", ylabel="tau (tokens per target step)", title="held-out acceptance length")
    fig.savefig(out_path)
    return Path(out_path)
