"""The training loop: it learns, it resumes exactly, and it exports a checkpoint the pair check ties to its target."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import greedy_reference, make_drafter, make_target, random_prompt
from transformers import PreTrainedModel

from transformers_dflash import DFlashDraftModel
from transformers_dflash.pair_check import check_pair
from transformers_dflash.training.blocks import build_block_batch, flex_block_mask, loss_weights
from transformers_dflash.training.evaluate import measure_tau
from transformers_dflash.training.export import export_drafter, record_target
from transformers_dflash.training.plots import plot_training_log
from transformers_dflash.training.sequences import TrainingSequence, sequences_from_responses
from transformers_dflash.training.trainer import LOG_FILE, DFlashTrainer, TrainConfig

VOCAB = 64


def permutation_target(seed: int = 0) -> tuple[PreTrainedModel, torch.Tensor]:
    """A tiny Llama whose greedy continuation of token x is perm[x]: predictable, yet only learnable from the target.

    Attention and MLP outputs are zeroed so the last hidden state is the current token's embedding; the LM head row
    of perm[x] is that embedding, so its logit wins. Special ids 0..3 are never produced.
    """
    target = make_target("llama", seed=seed, vocab_size=VOCAB, hidden_size=64, num_layers=2)
    perm = torch.randperm(VOCAB - 4, generator=torch.Generator().manual_seed(seed)) + 4
    with torch.no_grad():
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros_like(target.lm_head.weight)
        head[perm] = target.model.embed_tokens.weight[4:]
        target.lm_head.weight.copy_(head)
    return target, torch.cat([torch.zeros(4, dtype=torch.long), perm])


def greedy_rows(target: PreTrainedModel, count: int, prompt_len: int = 6, new: int = 40) -> list[dict]:
    """Regeneration rows (the `training.data` format) of the target's greedy responses to random prompts."""
    rows = []
    for i in range(count):
        prompt = random_prompt(i, prompt_len, VOCAB)
        with torch.no_grad():
            out = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=new)
        ids = out[0].tolist()
        rows.append({"id": f"r{i}", "prompt_ids": ids[:prompt_len], "response_ids": ids[prompt_len:]})
    return rows


def test_permutation_target_is_what_the_learning_test_assumes() -> None:
    target, perm = permutation_target()
    ids = greedy_rows(target, 1, new=8)[0]
    chain = [ids["prompt_ids"][-1], *ids["response_ids"]]
    assert all(perm[a] == b for a, b in zip(chain, chain[1:], strict=False))


def test_short_run_lowers_loss_and_raises_tau(tmp_path) -> None:
    target, _ = permutation_target()
    drafter = make_drafter(target, block_size=4, num_layers=2)
    sequences = sequences_from_responses(greedy_rows(target, 32), block_size=4)
    held_out = [random_prompt(100 + i, 6, VOCAB)[0].tolist() for i in range(3)]
    untrained = measure_tau(target, drafter, held_out, max_new_tokens=24, stop_token_ids=[1])
    config = TrainConfig(
        str(tmp_path), epochs=6, batch_size=4, num_anchors=16, learning_rate=3e-3, log_every=8, eval_every=48,
        eval_max_new_tokens=24, restricted_vocab=True,
    )  # fmt: skip
    trainer = DFlashTrainer(target, drafter, sequences, config, eval_prompts=held_out, stop_token_ids=[1])
    state = trainer.train()
    log = [json.loads(line) for line in (tmp_path / LOG_FILE).read_text().splitlines()]
    losses = [r["loss"] for r in log if r["event"] == "train"]
    assert losses[-1] < 0.6 * losses[0]
    trained = state["evals"][-1]["tau"]
    assert untrained.tau < 1.1 and trained > untrained.tau + 0.3, (untrained.tau, trained)
    final = [r for r in log if r["event"] == "train"][-1]
    assert len(final["acc_by_position"]) == 3 and final["acc_by_position"][0] > 0.3
    assert final["target_tokens_per_s"] > 0 and 0 < final["data_share"] < 1 and 0 < final["target_share"] < 1


@pytest.mark.parametrize("target_dtype", [torch.float32, torch.bfloat16])
def test_measure_tau_decodes_with_the_engine_losslessly(target_dtype) -> None:
    target = make_target("qwen3").to(target_dtype)
    drafter = make_drafter(target, block_size=4).float().train()  # training keeps an fp32 drafter
    prompts = [random_prompt(i, 5)[0].tolist() for i in range(2)]
    result = measure_tau(target, drafter, prompts, max_new_tokens=10)
    for prompt, output in zip(prompts, result.outputs, strict=True):
        assert output == greedy_reference(target, torch.tensor([prompt]), 10)[0, 5:].tolist()
    assert result.new_tokens == 20 and result.steps == sum(result.histogram) and len(result.histogram) == 4
    committed = sum(k * n for k, n in enumerate(result.histogram, start=1))
    assert result.tau == pytest.approx(committed / result.steps) and committed == 20 - len(prompts)
    assert drafter.training and next(drafter.parameters()).dtype == torch.float32  # left as it was


def _run(tmp_path, target, sequences, stop_after: int | None) -> DFlashTrainer:
    config = TrainConfig(str(tmp_path), epochs=2, batch_size=2, num_anchors=6, log_every=2, stop_after=stop_after)
    trainer = DFlashTrainer(target, make_drafter(target, block_size=4, seed=5), sequences, config)
    trainer.train()
    return trainer


def test_resume_reaches_the_same_weights(tmp_path) -> None:
    target = make_target("qwen3")
    sequences = [TrainingSequence(f"s{i}", random_prompt(i, 30)[0], 8) for i in range(8)]  # 4 steps per epoch
    straight = _run(tmp_path / "a", target, sequences, None)
    first = _run(tmp_path / "b", target, sequences, stop_after=3)
    assert first.state["step"] == 3 and (tmp_path / "b" / "checkpoints" / "step-00000003").is_dir()
    assert not list((tmp_path / "b" / "checkpoints").glob("*.tmp"))
    resumed = _run(tmp_path / "b", target, sequences, None)
    assert resumed.state["step"] == straight.state["step"] == 8
    expected = straight.accelerator.unwrap_model(straight.model).state_dict()
    for name, value in resumed.accelerator.unwrap_model(resumed.model).state_dict().items():
        torch.testing.assert_close(value, expected[name], atol=0, rtol=0, msg=name)
    assert resumed.scheduler.get_last_lr() == straight.scheduler.get_last_lr()


def test_export_records_the_target_and_writes_a_card(tmp_path) -> None:
    target = make_target("llama")
    sequences = [TrainingSequence(f"s{i}", random_prompt(i, 24)[0], 6) for i in range(2)]
    drafter = make_drafter(target, block_size=4)
    identity = record_target(drafter.config, target, "tiny/llama")
    config = TrainConfig(str(tmp_path / "run"), epochs=1, num_anchors=4, log_every=1)
    trainer = DFlashTrainer(target, drafter, sequences, config, run_info={"command": "dflash-train train --x"})
    trainer.train()
    out = export_drafter(
        tmp_path / "run" / "checkpoints" / "step-00000002",
        tmp_path / "export",
        base_model="tiny/llama",
        card_notes="## Evaluation\n\n| dataset | tau |\n|---|---|\n| gsm8k | 1.50 |\n",
        tau=2.024,
    )
    files = {"config.json", "model.safetensors", "dflash.py", "README.md", "training.png"}
    assert {p.name for p in out.iterdir()} >= files
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "config.json").read_text())
    assert saved["dflash_config"]["target"] == identity and saved["model_type"] == "qwen3"
    card = (out / "README.md").read_text()
    for needle in ("base_model: tiny/llama", "library_name: transformers", "pipeline_tag: text-generation",
                   "- dflash", "- speculative-decoding", "- block-diffusion", "license:", "assistant_model=drafter",
                   "vllm serve", "sglang.launch_server", "dflash-train train --x", "wall time", "](training.png)", "## Evaluation\n\n| dataset | tau |",
                   "| acceptance length tau (greedy, held-out prompts) | 2.02 |", "| tau by step | not measured |"):  # fmt: skip
        assert needle in card, needle
    loaded = DFlashDraftModel.from_pretrained(out)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    loaded.float()
    check_pair(target, loaded)
    with pytest.raises(ValueError, match="trained for"):
        check_pair(make_target("llama", seed=9), loaded)


def test_training_curves_need_training_records(tmp_path) -> None:
    log = tmp_path / "train_log.jsonl"
    log.write_text(json.dumps({"event": "start", "total_steps": 4}) + "\n")
    with pytest.raises(ValueError, match="no training records"):
        plot_training_log(log, tmp_path / "training.png")


def test_flex_block_mask_gives_the_dense_masks_forward(tmp_path) -> None:
    """The flex `BlockMask` and the dense mask make the same packed forward (CPU: forward only; torch has no flex
    backward there, so the trainer uses flex on CUDA and refuses it on the CPU)."""
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4, seed=5).eval()
    n, block = 30, 4
    anchors = torch.tensor([[3, 9, 17, 22], [5, 11, 0, 0]])  # the second row has two padded blocks
    ids = torch.cat([random_prompt(0, n), random_prompt(1, n)])  # (2, n)
    batch = build_block_batch(
        ids, ids, anchors, torch.tensor([4, 2]), block, drafter.mask_token_id, loss_weights(block)
    )
    context = torch.randn(2, n, drafter.fc.in_features)
    embeds = target.get_input_embeddings()(batch.noise_ids)
    with torch.no_grad():
        out = {
            kind: drafter(
                noise_embeds=embeds,
                context_hidden_states=context,
                position_ids=batch.position_ids,
                attention_mask=mask,
            ).last_hidden_state
            for kind, mask in (
                ("dense", batch.attention_mask),
                ("flex", flex_block_mask(batch.anchors, block, n)),
            )
        }
    torch.testing.assert_close(out["flex"], out["dense"], atol=1e-5, rtol=1e-4)
    sequences = [TrainingSequence(f"s{i}", random_prompt(i, 30)[0], 8) for i in range(4)]
    with pytest.raises(ValueError, match="no backward pass on the CPU.*--attention dense"):
        DFlashTrainer(target, make_drafter(target), sequences, TrainConfig(str(tmp_path / "f"), attention="flex"))
    assert not DFlashTrainer(target, make_drafter(target), sequences, TrainConfig(str(tmp_path / "a"))).flex
    with pytest.raises(ValueError, match="attention must be 'auto', 'dense' or 'flex'"):
        DFlashTrainer(target, make_drafter(target), sequences, TrainConfig(str(tmp_path / "x"), attention="sparse"))
