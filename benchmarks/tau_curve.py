"""Plot the embedded drafter's held-out tau against the response tokens it has trained on, one point per stage.

The measured points live in `benchmarks/tau_curve.json` (with where each came from); this draws them so the slope the
next stage is planned from can be seen rather than read:

    python benchmarks/tau_curve.py benchmarks/tau_curve.json --out benchmarks/results/tau_curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers_dflash.bench_plots import new_figure

SETS = ("all", "GSM8K", "HumanEval", "MT-Bench")
GOAL_TAU = 2.0


def plot_tau_curve(stages: list[dict], path: Path) -> Path:
    """Held-out tau (36 prompts: overall and per bench set; 12 prompts for the early stages) vs millions of tokens."""
    fig = new_figure(7.0, 4.0)
    ax = fig.add_subplot()
    early = [s for s in stages if "held12" in s]
    ax.plot([s["tokens_m"] for s in early], [s["held12"] for s in early], "s:", color="grey", label="12 prompts x 128")
    later = [s for s in stages if "held36" in s]
    shipped = [s for s in later if s["shipped"]]
    others = [s for s in later if not s["shipped"]]
    for name in SETS:
        (line,) = ax.plot(
            [s["tokens_m"] for s in shipped],
            [s["held36"][name] for s in shipped],
            "o-" if name == "all" else "o--",
            linewidth=2 if name == "all" else 1,
            label=f"36 prompts: {name}" if name == "all" else f"36 prompts: bench {name}",
        )
        ax.plot([s["tokens_m"] for s in others], [s["held36"][name] for s in others], "x", color=line.get_color())
    for s in later:
        ax.annotate(  # shipped stages labelled below their point, the others to the right of their cross
            s["stage"],
            (s["tokens_m"], s["held36"]["all"]),
            textcoords="offset points",
            xytext=(0, -13) if s["shipped"] else (6, -3),
            ha="center" if s["shipped"] else "left",
            fontsize=7,
        )
    ax.axhline(GOAL_TAU, color="black", linewidth=0.8, linestyle="--", label=f"goal (tau {GOAL_TAU:g})")
    ax.set_xlabel("regenerated response tokens trained on, millions (passes counted)")
    ax.set_ylabel("held-out tau (whole blocks of 16)")
    ax.set_title("Embedded drafter: held-out tau per stage (o shipped, x not shipped)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("points", type=Path, help="the measured points (benchmarks/tau_curve.json)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/tau_curve.png"))
    args = parser.parse_args()
    print(plot_tau_curve(json.loads(args.points.read_text())["stages"], args.out))


if __name__ == "__main__":
    main()
