"""The objective: weighted same-position cross-entropy through the frozen head, restricted vocabulary, statistics."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from conftest import make_drafter, make_target, random_prompt
from torch import nn

from transformers_dflash.training.blocks import IGNORE_INDEX, loss_weights
from transformers_dflash.training.objective import DraftObjective
from transformers_dflash.training.sequences import TrainingSequence
from transformers_dflash.training.trainer import DFlashTrainer, TrainConfig

B, V, H = 4, 50, 8


def _objective(vocabulary: torch.Tensor | None = None) -> DraftObjective:
    torch.manual_seed(0)
    return DraftObjective(nn.Embedding(V, H), nn.Linear(H, V, bias=False), B, vocabulary)


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 3 * B, H, generator=g, requires_grad=True)
    labels = torch.randint(0, V, (2, 3 * B), generator=g)
    labels[:, ::B] = IGNORE_INDEX
    return hidden, labels, loss_weights(B).repeat(3).expand(2, -1)


def test_loss_is_the_weighted_mean_cross_entropy() -> None:
    objective = _objective()
    hidden, labels, weights = _inputs()
    out = objective(hidden, labels, weights)
    logits = hidden.detach() @ objective.head_weight.T  # (2, q, V)
    ce = F.cross_entropy(logits.view(-1, V), labels.view(-1), reduction="none", ignore_index=IGNORE_INDEX).view(2, -1)
    assert torch.allclose(out.loss, (ce * weights).sum() / weights.sum())
    assert out.total.tolist() == [0, 6, 6, 6] and out.blocks == 6
    assert 6 <= out.accepted <= 6 * B


def test_restricted_vocabulary_over_every_id_equals_the_full_head_and_drops_others() -> None:
    hidden, labels, weights = _inputs()
    full, every = _objective()(hidden, labels, weights), _objective(torch.arange(V))(hidden, labels, weights)
    assert torch.allclose(full.loss, every.loss) and torch.equal(full.correct, every.correct)
    kept = torch.unique(labels[labels >= 0])[::2]
    part = _objective(kept)(hidden, labels, weights)
    assert part.total.sum() == torch.isin(labels, kept).sum() and part.loss < full.loss


def test_gradient_checkpointing_gives_the_same_gradients(tmp_path) -> None:
    target = make_target("llama")
    seqs = [TrainingSequence("s", random_prompt(0, 30)[0], 8)]
    grads = []
    for checkpointing in (False, True):
        config = TrainConfig(str(tmp_path / str(checkpointing)), epochs=1, num_anchors=4)
        config.gradient_checkpointing = checkpointing
        trainer = DFlashTrainer(target, make_drafter(target, block_size=4), seqs, config)
        assert trainer.accelerator.unwrap_model(trainer.model).layers[0].gradient_checkpointing == checkpointing
        out = trainer.loss(*trainer.make_batch([0], epoch=0))
        trainer.accelerator.backward(out.loss)
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])
