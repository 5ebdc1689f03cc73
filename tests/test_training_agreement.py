"""The packed training forward equals the drafter's inference forward, block by block.

This pins the +1 hidden-state offset (training reads the same target layers as inference) and the mask id (the
blocks the trainer builds are the `[anchor, MASK...]` blocks inference drafts from).
"""

from __future__ import annotations

import pytest
import torch
from conftest import MASK, make_drafter, make_target, random_prompt
from transformers import DynamicCache

from transformers_dflash.training.features import FeatureCache, FeatureSource, build_feature_cache, capture_features
from transformers_dflash.training.sequences import TrainingSequence
from transformers_dflash.training.trainer import DFlashTrainer, TrainConfig


def inference_logits(target, drafter, ids: torch.LongTensor, anchor: int) -> torch.Tensor:
    """(B, V) logits of inference drafting at `anchor`: context = target features of ids[:anchor], computed
    independently of the training code (full `hidden_states` tuple, index = layer id + 1)."""
    with torch.no_grad():
        out = target(ids[None, :anchor], output_hidden_states=True)
        context = torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], dim=-1)
        block = torch.tensor([[int(ids[anchor])] + [MASK] * (drafter.block_size - 1)])
        hidden = drafter(
            noise_embeds=target.get_input_embeddings()(block), context_hidden_states=context, cache=DynamicCache()
        ).last_hidden_state
        return target.get_output_embeddings()(hidden)[0]


def test_training_forward_equals_inference_forward(family: str, tmp_path) -> None:
    target = make_target(family)
    drafter = make_drafter(target, block_size=4, features=3)
    prompt = random_prompt(3, 40)[0]
    seq = TrainingSequence("s0", prompt, response_start=10)
    trainer = DFlashTrainer(target, drafter, [seq], TrainConfig(str(tmp_path), epochs=1, num_anchors=5))
    trainer.model.eval()
    batch, feats = trainer.make_batch([0], epoch=0)
    assert (batch.noise_ids.view(-1, 4)[:, 1:] == MASK).all()
    with torch.no_grad():
        hidden = trainer.model(
            noise_embeds=trainer.objective.embed(batch.noise_ids),
            context_hidden_states=feats.hidden,
            position_ids=batch.position_ids,
            attention_mask=batch.attention_mask,
        ).last_hidden_state
        packed = target.get_output_embeddings()(hidden)[0].view(5, 4, -1)  # (blocks, B, V)
    for j, anchor in enumerate(batch.anchors[0].tolist()):
        torch.testing.assert_close(packed[j], inference_logits(target, drafter, prompt, anchor), atol=1e-4, rtol=1e-4)


def test_feature_cache_round_trip_and_resume(tmp_path) -> None:
    target = make_target("llama")
    layers = [0, 2]
    seqs = [(f"s{i}", random_prompt(i, 12 + i)[0].tolist()) for i in range(3)]
    cache = build_feature_cache(target, seqs[:2], tmp_path, layers, with_predictions=True)
    with (tmp_path / "shard-00000.f16").open("ab") as handle:  # a killed run: rows written, never indexed
        handle.write(b"\0" * 1000)
    cache = build_feature_cache(target, seqs, tmp_path, layers, with_predictions=True)
    assert len(cache) == 3
    for sequence_id, ids in seqs:
        online = capture_features(target, torch.tensor([ids]), layers, with_predictions=True)
        stored = FeatureCache(tmp_path).get(sequence_id)
        torch.testing.assert_close(stored.hidden.float(), online.hidden, atol=2e-2, rtol=1e-2)  # fp16 on disk
        assert torch.equal(stored.predictions, online.predictions)
        assert torch.equal(online.predictions[0], target(torch.tensor([ids])).logits[0].argmax(-1))
    build_feature_cache(target, seqs, tmp_path / "straight", layers, with_predictions=True)
    # killed and resumed == uninterrupted, byte for byte
    for name in ("index.jsonl", "meta.json", "shard-00000.f16", "shard-00000.i32"):
        assert (tmp_path / name).read_bytes() == (tmp_path / "straight" / name).read_bytes(), name


def test_feature_cache_stores_a_bfloat16_target(tmp_path) -> None:
    """`features --dtype bfloat16` (AMX CPUs, GPUs): numpy has no bfloat16, the writer must convert."""
    target = make_target("llama").to(torch.bfloat16)
    ids = random_prompt(5, 14)[0].tolist()
    cache = build_feature_cache(target, [("s0", ids)], tmp_path, [0, 2], with_predictions=True, top_k=4)
    online = capture_features(target, torch.tensor([ids]), [0, 2], with_predictions=True, top_k=4)
    stored = cache.get("s0")
    torch.testing.assert_close(stored.hidden.float(), online.hidden.float(), atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(stored.top_logprobs.float(), online.top_logprobs.float(), atol=2e-2, rtol=1e-2)
    assert torch.equal(stored.predictions, online.predictions)
    assert torch.equal(stored.top_ids, online.top_ids)


def test_feature_source_reads_a_subset_of_the_cached_layers(tmp_path) -> None:
    target = make_target("llama")
    seqs = [(f"s{i}", random_prompt(i, 10 + i)[0].tolist()) for i in range(2)]
    cache = build_feature_cache(target, seqs, tmp_path, [0, 1, 3])
    batch = [(sequence_id, torch.tensor(ids)) for sequence_id, ids in seqs]
    subset = FeatureSource(target, [3, 0], cache)(batch, torch.device("cpu")).hidden  # (2, 11, 2 * 32)
    online = FeatureSource(target, [3, 0])(batch, torch.device("cpu")).hidden
    assert subset.shape == online.shape == (2, 11, 64)
    for row, (_, ids) in enumerate(seqs):  # real positions (padding differs: zeros vs the pad token's features)
        torch.testing.assert_close(subset[row, : len(ids)].float(), online[row, : len(ids)], atol=2e-2, rtol=1e-2)
    with pytest.raises(ValueError, match=r"\[2\] missing"):
        FeatureSource(target, [0, 2], cache)
