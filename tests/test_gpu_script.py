"""benchmarks/gpu/run.py (the prepared H200 check) runs at tiny shapes on the CPU and writes its one table."""

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run.py"


def test_tiny_run_writes_one_table_with_every_method(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_run", SCRIPT)
    run = importlib.util.module_from_spec(spec)
    sys.modules["gpu_run"] = run  # Dynamo looks the forced drafter's module up while it compiles
    spec.loader.exec_module(run)
    sections = "embedded:bfloat16,qwen3-8b:bfloat16"  # the eager methods on one pair, every method on the other
    argv = ["--device", "cpu", "--tiny", "--compile-backend", "eager", "--prompts", "1", "--new-tokens", "10"]
    table = run.main([*argv, "--sections", sections, "--out", str(tmp_path)])
    assert (tmp_path / "table.md").read_text().strip() == table
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["pair"], r["method"]) for r in rows] == [("embedded", m) for m in run.EAGER_METHODS] + [
        ("qwen3-8b", m) for m in run.ALL_METHODS
    ]
    for row in rows:
        assert row["tok_s"] > 0 and row["identical"] == 1 and not row["mismatches"]  # greedy == target.generate
    forced = {r["method"]: r["tau"] for r in rows if r["pair"] == "qwen3-8b"}
    assert forced["dflash"] == forced["dflash-compiled"] == forced["native"] > 1.5  # the forced drafter's hits
    assert "| qwen3-8b | bfloat16 | dflash-compiled |" in table
