"""Several feature caches serve one run: earlier stages' caches replayed together, each read in the drafter's
layer order, and a sequence no cache holds refused before the first step."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import MASK, make_drafter, make_target, random_prompt, write_responses

from transformers_dflash.training.cli import main as train_cli
from transformers_dflash.training.features import FeatureSource, build_feature_cache
from transformers_dflash.training.sequences import TrainingSequence
from transformers_dflash.training.trainer import DFlashTrainer, TrainConfig


def test_each_sequence_is_read_from_the_cache_holding_it_in_the_drafters_layer_order(tmp_path) -> None:
    target = make_target("llama")
    seqs = [(f"s{i}", random_prompt(i, 9 + i)[0].tolist()) for i in range(4)]
    first = build_feature_cache(target, seqs[:2], tmp_path / "a", [0, 2], with_predictions=True)
    second = build_feature_cache(target, seqs[2:], tmp_path / "b", [3, 2, 1, 0], with_predictions=True)
    source = FeatureSource(target, [0, 2], [first, second], with_predictions=True)
    assert source.kind == "cached" and source.uncached(["s3", "s9"]) == ["s9"]
    batch = [(sequence_id, torch.tensor(ids)) for sequence_id, ids in seqs]
    cached = source(batch, torch.device("cpu"))  # (4, 12, 2 * 32)
    online = FeatureSource(target, [0, 2], with_predictions=True)(batch, torch.device("cpu"))
    assert cached.hidden.shape == online.hidden.shape == (4, 12, 64)
    for row, (_, ids) in enumerate(seqs):  # real positions (padding differs: zeros vs the pad token's features)
        n = len(ids)
        torch.testing.assert_close(cached.hidden[row, :n].float(), online.hidden[row, :n], atol=2e-2, rtol=1e-2)
        assert torch.equal(cached.predictions[row, :n], online.predictions[row, :n])
    with pytest.raises(KeyError, match="none of the feature caches"):
        source([("s9", torch.tensor(seqs[0][1]))], torch.device("cpu"))
    with pytest.raises(ValueError, match=r"holds target layers \[0, 2\].*\[1\] missing"):
        FeatureSource(target, [0, 1], [second, first])


def test_trainer_refuses_sequences_no_cache_holds_before_training(tmp_path) -> None:
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    seqs = [TrainingSequence(f"s{i}", random_prompt(i, 30)[0], 8) for i in range(3)]
    cache = build_feature_cache(
        target, [(s.id, s.input_ids.tolist()) for s in seqs[:2]], tmp_path / "c", drafter.target_layer_ids
    )
    with pytest.raises(ValueError, match=r"1 of 3 sequences \(e.g. 's2'\) are in none of the feature caches"):
        DFlashTrainer(target, drafter, seqs, TrainConfig(str(tmp_path / "run")), feature_cache=[cache])


def test_cli_trains_on_two_stages_caches_together(tmp_path) -> None:
    target = make_target("llama")
    target.save_pretrained(tmp_path / "target")
    common = ["--target", str(tmp_path / "target"), "--mask-token-id", str(MASK), "--labels", "target"]
    common += ["--draft-layers", "1", "--target-features", "2", "--block-size", "4"]
    one = write_responses(tmp_path / "one", 2)
    two = write_responses(tmp_path / "two", 2)
    rows = [json.loads(line) for line in (two / "responses.jsonl").read_text().splitlines()]
    (two / "responses.jsonl").write_text("".join(json.dumps({**r, "id": "two-" + r["id"]}) + "\n" for r in rows))
    for work in (one, two):
        train_cli(["features", *common, "--work-dir", str(work)])
    both = ["--responses", str(one / "responses.jsonl"), "--responses", str(two / "responses.jsonl")]
    replay = ["--work-dir", str(tmp_path / "replay"), "--eval-prompts", "0"]
    with pytest.raises(FileNotFoundError, match="is not a feature cache"):
        train_cli(["train", *common, *both, *replay, "--feature-cache", str(tmp_path / "none")])
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "responses.jsonl").write_text((one / "responses.jsonl").read_text())
    with pytest.raises(ValueError, match="'responses:r0' occurs twice"):  # same ids, same file name
        train_cli(["train", *common, *both[:2], "--responses", str(tmp_path / "copy" / "responses.jsonl"), *replay])
    with pytest.raises(ValueError, match="2 of 4 sequences"):
        train_cli(["train", *common, *both, *replay, "--feature-cache", str(one / "features")])
    caches = ["--feature-cache", str(one / "features"), "--feature-cache", str(two / "features")]
    train_cli(["train", *common, *both, *caches, *replay, "--features", "cache", "--epochs", "1"])
    log = [json.loads(line) for line in (tmp_path / "replay" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["event"] == "train"] == [4]
