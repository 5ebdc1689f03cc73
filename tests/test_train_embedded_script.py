"""The prepared H200 training run (`benchmarks/gpu/train_embedded.sh`), end to end at tiny scale on the CPU: the same
entry point, calibration, time-boxed training and packaging the GPU run uses, so that run works the first time."""

from __future__ import annotations

import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "train_embedded.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_tiny_run_trains_exports_and_logs(tmp_path) -> None:
    g = torch.Generator().manual_seed(0)
    rows = [
        {"id": f"r{i}", "source": "gsm8k", "prompt_ids": torch.randint(6, 49152, (12,), generator=g).tolist(),
         "response_ids": torch.randint(6, 49152, (40,), generator=g).tolist()}
        for i in range(8)
    ]  # fmt: skip
    responses = tmp_path / "responses.jsonl.xz"
    responses.write_bytes(lzma.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(SCRIPT), "tiny", str(responses)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train_status"] == summary["export_status"] == 0 and summary["tiny"] and summary["steps"] >= 1
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    final = [r for r in log if r["event"] == "train"][-1]
    assert final["target_tokens_per_s"] > 0 and 0 <= final["data_share"] < 1
    packed = b"".join(part.read_bytes() for part in sorted(out.glob("drafter.tar.xz.part-*")))
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(packed))) as archive:
        names = set(archive.getnames())
    assert {"drafter/config.json", "drafter/model.safetensors", "drafter/README.md"} <= names
