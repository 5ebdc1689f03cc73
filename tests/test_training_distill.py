"""Distillation: the target's top-k per position (captured, cached, aligned to block positions) and the soft loss."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import MASK, make_drafter, make_target, random_prompt, write_responses
from torch import nn

from transformers_dflash.training.blocks import (
    IGNORE_INDEX,
    build_block_batch,
    labels_from_predictions,
    loss_weights,
    soft_labels_from_top_k,
)
from transformers_dflash.training.cli import main as train_cli
from transformers_dflash.training.features import FeatureCache, FeatureSource, build_feature_cache, capture_features
from transformers_dflash.training.objective import DraftObjective
from transformers_dflash.training.sequences import TrainingSequence
from transformers_dflash.training.trainer import DFlashTrainer, TrainConfig

B, V, H = 4, 50, 8


def test_capture_features_top_k_is_the_targets_own_distribution() -> None:
    target = make_target("qwen3")
    ids = random_prompt(0, 20)[0][None]
    feats = capture_features(target, ids, [0, 1], top_k=5)
    with torch.no_grad():
        reference = target(ids).logits.float().log_softmax(-1).topk(5, dim=-1)
    assert feats.top_ids.shape == feats.top_logprobs.shape == (1, 20, 5)
    assert torch.equal(feats.top_ids, reference.indices)
    torch.testing.assert_close(feats.top_logprobs, reference.values)
    assert torch.equal(feats.predictions, feats.top_ids[..., 0])  # top-k implies the argmax


def test_cache_stores_top_k_resumes_and_serves_a_smaller_k(tmp_path) -> None:
    target = make_target("llama")
    seqs = [(f"s{i}", random_prompt(i, 12 + i)[0].tolist()) for i in range(3)]
    build_feature_cache(target, seqs[:2], tmp_path, [0, 2], top_k=6)
    with (tmp_path / "shard-00000.topp.f16").open("ab") as handle:  # a killed run: rows written, never indexed
        handle.write(b"\0" * 96)
    cache = build_feature_cache(target, seqs, tmp_path, [0, 2], top_k=6)
    assert cache.top_k == 6 and cache.has_predictions and len(cache) == 3
    for sequence_id, ids in seqs:
        online = capture_features(target, torch.tensor([ids]), [0, 2], top_k=6)
        stored = FeatureCache(tmp_path).get(sequence_id)
        assert torch.equal(stored.top_ids, online.top_ids) and torch.equal(stored.predictions, online.predictions)
        torch.testing.assert_close(stored.top_logprobs.float(), online.top_logprobs, atol=1e-2, rtol=1e-3)  # fp16
    batch = [(sequence_id, torch.tensor(ids)) for sequence_id, ids in seqs]
    served = FeatureSource(target, [0, 2], cache, top_k=3)(batch, torch.device("cpu"))
    assert served.top_ids.shape == (3, 14, 3) and torch.equal(served.top_ids[0, :12], stored_prefix(tmp_path, 3))
    with pytest.raises(ValueError, match="features --top-k 8"):
        FeatureSource(target, [0, 2], cache, top_k=8)
    with pytest.raises(ValueError, match="holds a feature cache"):  # another k in the same folder
        build_feature_cache(target, seqs, tmp_path, [0, 2], top_k=4)


def stored_prefix(directory, k: int) -> torch.Tensor:
    return FeatureCache(directory).get("s0").top_ids[0, :, :k]


def test_soft_labels_land_on_the_block_positions_they_describe() -> None:
    ids = torch.arange(100, 120)  # (20,)
    top_ids = torch.stack([ids + 1, ids + 2], dim=-1)  # the "target" predicts token + 1 (then + 2) next
    top_logprobs = torch.log(torch.tensor([0.75, 0.25])).expand(20, 2)
    soft = soft_labels_from_top_k(top_ids, top_logprobs)
    labels = labels_from_predictions(ids, top_ids[:, 0])
    anchors = torch.tensor([3, 9])
    batch = build_block_batch(ids[None], labels[None], anchors[None], torch.tensor([2]), B, 0, loss_weights(B), True,
                              soft[0][None], soft[1][None])  # fmt: skip
    assert batch.soft_ids.shape == (1, 2 * B, 2)
    for j, anchor in enumerate(anchors.tolist()):
        for k in range(1, B):  # position k predicts the token at anchor + k: the target's top-k at anchor + k - 1
            assert batch.soft_ids[0, j * B + k].tolist() == [ids[anchor + k], ids[anchor + k] + 1]
            assert batch.soft_ids[0, j * B + k, 0] == batch.labels[0, j * B + k]
        assert batch.labels[0, j * B] == IGNORE_INDEX


def _objective(distill: float, vocabulary: torch.Tensor | None = None) -> DraftObjective:
    torch.manual_seed(0)
    return DraftObjective(nn.Embedding(V, H), nn.Linear(H, V, bias=False), B, vocabulary, distill=distill)


def _inputs(k: int = 3) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 3 * B, H, generator=g)
    labels = torch.randint(0, V, (2, 3 * B), generator=g)
    labels[:, ::B] = IGNORE_INDEX
    soft_ids = torch.cat([labels.clamp_min(0)[..., None], torch.randint(0, V, (2, 3 * B, k - 1), generator=g)], -1)
    soft_logprobs = torch.randn(2, 3 * B, k, generator=g).log_softmax(-1)
    return hidden, labels, loss_weights(B).repeat(3).expand(2, -1), soft_ids, soft_logprobs


def test_distill_zero_is_the_hard_loss_and_one_is_the_soft_cross_entropy() -> None:
    hidden, labels, weights, soft_ids, soft_logprobs = _inputs()
    hard = _objective(0.0)(hidden, labels, weights)
    assert torch.equal(_objective(0.0)(hidden, labels, weights, soft_ids, soft_logprobs).loss, hard.loss)
    objective = _objective(1.0)
    soft = objective(hidden, labels, weights, soft_ids, soft_logprobs)
    log_q = (hidden @ objective.head_weight.T).log_softmax(-1)  # (2, q, V)
    expected = -(soft_logprobs.exp() * log_q.gather(-1, soft_ids)).sum(-1)  # (2, q)
    keep = weights > 0
    torch.testing.assert_close(soft.loss, (expected * weights)[keep].sum() / weights[keep].sum())
    one_hot = _objective(1.0)(hidden, labels, weights, labels.clamp_min(0)[..., None], torch.zeros(2, 3 * B, 1))
    torch.testing.assert_close(one_hot.loss, hard.loss)  # a one-point distribution is the hard label
    half = _objective(0.5)(hidden, labels, weights, soft_ids, soft_logprobs)
    torch.testing.assert_close(half.loss, (hard.loss + soft.loss) / 2)
    assert torch.equal(soft.correct, hard.correct)  # accuracy is always against the hard label


def test_candidates_outside_the_restricted_vocabulary_are_dropped_and_the_rest_renormalised() -> None:
    hidden, labels, weights, soft_ids, soft_logprobs = _inputs()
    vocabulary = torch.unique(torch.cat([labels[labels >= 0], soft_ids[..., 1].flatten()]))  # 3rd may be out
    objective = _objective(1.0, vocabulary)
    restricted = objective(hidden, labels, weights, soft_ids, soft_logprobs)
    inside = torch.isin(soft_ids, vocabulary)
    assert not inside.all()
    p = torch.where(inside, soft_logprobs, -torch.inf).softmax(-1)  # (2, q, k) renormalised over kept candidates
    log_q = torch.full((2, 3 * B, V), -torch.inf)
    log_q[..., vocabulary] = (hidden @ objective.head_weight.T).log_softmax(-1)  # softmax over the kept rows only
    per_query = -(p * torch.where(inside, log_q.gather(-1, soft_ids), 0.0)).sum(-1)
    keep = weights > 0
    torch.testing.assert_close(restricted.loss, (per_query * weights)[keep].sum() / weights[keep].sum())


def test_distillation_is_refused_without_top_k_and_trains_online_and_cached_alike(tmp_path) -> None:
    target = make_target("llama")
    seqs = [TrainingSequence(f"s{i}", random_prompt(i, 30)[0], 8) for i in range(2)]
    with pytest.raises(ValueError, match="top-k"):
        DFlashTrainer(target, make_drafter(target, block_size=4), seqs, TrainConfig(str(tmp_path / "x"), distill=0.5))
    drafter = make_drafter(target, block_size=4)
    cache = build_feature_cache(
        target, [(s.id, s.input_ids.tolist()) for s in seqs], tmp_path / "cache", drafter.target_layer_ids, top_k=4
    )
    losses = []
    for name, feature_cache in (("online", None), ("cached", cache)):
        config = TrainConfig(str(tmp_path / name), epochs=1, num_anchors=4, labels="target", distill=0.5, top_k=4)
        trainer = DFlashTrainer(target, make_drafter(target, block_size=4), seqs, config, feature_cache=feature_cache)
        batch, feats = trainer.make_batch([0, 1], epoch=0)
        assert batch.soft_ids.shape == (2, 4 * 4, 4)
        kept = batch.weights > 0
        assert torch.equal(batch.soft_ids[..., 0][kept], batch.labels[kept])  # top-1 is the argmax label
        losses.append(trainer.loss(batch, feats).loss)
    torch.testing.assert_close(losses[0], losses[1], atol=5e-3, rtol=1e-3)  # fp16 cache vs fp32 online


def test_cli_caches_top_k_then_distills_and_names_the_missing_flag(tmp_path) -> None:
    target = make_target("llama")
    target.save_pretrained(tmp_path / "target")
    work = write_responses(tmp_path / "run", 2)
    common = ["--target", str(tmp_path / "target"), "--work-dir", str(work), "--mask-token-id", str(MASK)]
    common += ["--draft-layers", "1", "--target-features", "2", "--block-size", "4", "--labels", "target"]
    with pytest.raises(ValueError, match="--top-k"):
        train_cli(["train", *common, "--distill", "0.5", "--eval-prompts", "0", "--features", "online"])
    train_cli(["features", *common, "--top-k", "4"])
    assert FeatureCache(work / "features").top_k == 4
    train_cli(["train", *common, "--top-k", "4", "--distill", "0.5", "--features", "cache", "--epochs", "1"])
    log = [json.loads(line) for line in (work / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["config"]["distill"] == 0.5 and log[0]["config"]["top_k"] == 4
    assert [r["step"] for r in log if r["event"] == "train"] == [2]
