"""The embedded drafter's measured tau curve (`benchmarks/tau_curve.json`) is well-formed and draws."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
POINTS = ROOT / "benchmarks" / "tau_curve.json"


def test_points_are_complete_and_ordered() -> None:
    stages = json.loads(POINTS.read_text())["stages"]
    tokens = [s["tokens_m"] for s in stages]
    assert tokens == sorted(tokens), "stages are listed in the order they saw tokens"
    assert len({s["stage"] for s in stages}) == len(stages)
    for s in stages:
        assert "held12" in s or "held36" in s, s["stage"]
        if "held36" in s:
            assert set(s["held36"]) == {"all", "GSM8K", "HumanEval", "MT-Bench"}, s["stage"]
            assert all(1.0 <= v <= 16.0 for v in s["held36"].values()), s["stage"]  # tau lies in [1, block size]


def test_script_draws_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "tau.png"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tau_curve.py"), str(POINTS), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
