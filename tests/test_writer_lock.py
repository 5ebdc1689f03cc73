"""One writer per output: a second `features`, `responses` or `train` run on the same files stops at once with an
error naming the fix, without touching what the first one is writing; a killed writer leaves no lock behind.

On Linux a `flock` belongs to an open file description, so a second lock taken in this process conflicts exactly as
one taken by another process would; one test also uses a real second process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import make_drafter, make_target, random_prompt

from transformers_dflash.training.data import _open_for_append
from transformers_dflash.training.features import FeatureCacheWriter, TargetFeatures
from transformers_dflash.training.sequences import TrainingSequence
from transformers_dflash.training.trainer import DFlashTrainer, TrainConfig
from transformers_dflash.training.writer_lock import WriterLock

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no fcntl: no lock on Windows")

_HOLD = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
_HOLD += "print('locked', flush=True); time.sleep(120)"


def _features(n: int) -> TargetFeatures:
    return TargetFeatures(torch.randn(1, n, 8))


def test_a_second_feature_cache_writer_is_refused_until_the_first_closes(tmp_path) -> None:
    first = FeatureCacheWriter(tmp_path / "cache", 8, [1])
    first.write("a", _features(5))
    with pytest.raises(RuntimeError, match="Another process is writing a feature cache .*--work-dir"):
        FeatureCacheWriter(tmp_path / "cache", 8, [1])
    first.write("b", _features(3))  # the refused writer cut nothing off
    first.close()
    second = FeatureCacheWriter(tmp_path / "cache", 8, [1])
    assert second.done == {"a", "b"} and second.rows == 8
    second.close()


def test_a_refused_cache_lets_the_next_writer_in(tmp_path) -> None:
    FeatureCacheWriter(tmp_path / "cache", 8, [1]).close()
    with pytest.raises(ValueError, match="use another folder"):
        FeatureCacheWriter(tmp_path / "cache", 16, [1, 2])  # another layout: refused, and the lock released
    FeatureCacheWriter(tmp_path / "cache", 8, [1]).close()


def test_a_killed_writer_process_leaves_no_lock(tmp_path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RuntimeError, match="Another process"):
            FeatureCacheWriter(folder, 8, [1])
    finally:
        holder.kill()
        holder.wait()
    FeatureCacheWriter(folder, 8, [1]).close()  # no stale lock file to delete


def test_responses_are_refused_while_another_run_appends(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "x", "source": "s", "prompt_te')  # the other run's line, half written
    with WriterLock(path, "responses"), pytest.raises(RuntimeError, match="writing responses"):
        with _open_for_append(path):  # both `responses` paths (local target, server) append through it
            pass
    assert path.read_text() == '{"id": "x", "source": "s", "prompt_te'  # not cut off by the refused run
    with _open_for_append(path) as handle:  # the other run gone: its cut line is repaired as before
        handle.write('{"id": "y"}\n')
    assert path.read_text() == '{"id": "y"}\n'


def test_a_second_training_run_on_one_folder_is_refused(tmp_path) -> None:
    target = make_target("qwen3")
    sequences = [TrainingSequence(f"s{i}", random_prompt(i, 30)[0], 8) for i in range(2)]
    config = TrainConfig(str(tmp_path), epochs=1, batch_size=2, num_anchors=4)
    trainer = DFlashTrainer(target, make_drafter(target, block_size=4, seed=5), sequences, config)
    with WriterLock(tmp_path, "a training run"), pytest.raises(RuntimeError, match="writing a training run"):
        trainer.train()
    assert not (tmp_path / "checkpoints").exists()
    assert trainer.train()["step"] == 1  # the lock went with the other run
