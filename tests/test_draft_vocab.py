"""A drafter's draft vocabulary: the file beside the weights, the restricted head, and lossless decoding with it."""

import pytest
import torch
from conftest import greedy_reference, make_drafter, make_forced_drafter, make_target, random_prompt
from safetensors.torch import load_file
from torch import nn

from transformers_dflash import DFlashDraftModel
from transformers_dflash.draft_vocab import DRAFT_VOCAB_FILE, DraftHead, check_draft_vocab, load_draft_vocab
from transformers_dflash.engine import dflash_generate, engine_for


def test_vocab_is_saved_beside_the_zlab_weights_and_reloaded(tmp_path):
    drafter = make_drafter(make_target())
    drafter.save_pretrained(tmp_path / "plain")
    assert not (tmp_path / "plain" / DRAFT_VOCAB_FILE).exists()
    assert DFlashDraftModel.from_pretrained(tmp_path / "plain").draft_vocab is None
    drafter.set_draft_vocab(torch.tensor([7, 3, 3, 50]))
    assert drafter.draft_vocab.tolist() == [3, 7, 50]  # sorted, unique
    drafter.save_pretrained(tmp_path / "vocab")
    weights = load_file(tmp_path / "vocab" / "model.safetensors")
    assert set(weights) == set(load_file(tmp_path / "plain" / "model.safetensors"))  # z-lab names only
    again = DFlashDraftModel.from_pretrained(tmp_path / "vocab")
    assert again.draft_vocab.tolist() == [3, 7, 50] and again.draft_vocab.dtype == torch.long
    assert "draft_vocab" not in again.state_dict()
    assert load_draft_vocab(tmp_path / "plain") is None


@pytest.mark.parametrize(
    ("ids", "match"),
    [(torch.tensor([1, 96]), "another tokenizer"), (torch.tensor([-1, 2]), r"\[0, 96\)"),
     (torch.tensor([[1, 2]]), "1-D"), (torch.tensor([]), "non-empty"), (torch.tensor([1.0]), "token ids")],
)  # fmt: skip
def test_bad_vocab_is_refused_with_the_reason(ids, match):
    with pytest.raises(ValueError, match=match):
        check_draft_vocab(ids, vocab_size=96)


@pytest.mark.parametrize("bias", [False, True])
def test_draft_head_is_the_target_head_on_the_vocab_and_minus_inf_elsewhere(bias):
    torch.manual_seed(0)
    head, vocab = nn.Linear(16, 40, bias=bias), torch.tensor([2, 5, 11, 39])
    restricted, hidden = DraftHead(), torch.randn(3, 4, 16)
    restricted.update(head, None)
    torch.testing.assert_close(restricted(hidden), head(hidden).detach())  # no vocabulary: the head itself
    restricted.update(head, vocab)
    logits, full = restricted(hidden), head(hidden).detach()
    torch.testing.assert_close(logits[..., vocab], full[..., vocab])
    outside = torch.ones(40, dtype=torch.bool).index_fill_(0, vocab, False)
    assert torch.isneginf(logits[..., outside]).all()
    head.weight = nn.Parameter(head.weight * 3)  # a new weight (e.g. moved or cast): its rows are copied again
    restricted.update(head, vocab)
    torch.testing.assert_close(restricted(hidden)[..., vocab], head(hidden).detach()[..., vocab])


def test_greedy_with_a_vocab_equals_generate_across_families_and_seeds(family):
    target = make_target(family)
    drafter = make_drafter(target, block_size=4)
    drafter.set_draft_vocab(torch.arange(0, 96, 3))
    for seed in range(3):
        ids = random_prompt(seed, 4 + 3 * seed)
        out = dflash_generate(target, drafter, ids, max_new_tokens=20)
        assert torch.equal(out.sequences, greedy_reference(target, ids, 20))


def test_forced_drafts_are_kept_inside_the_vocab_and_never_outside():
    target = make_target("qwen3", vocab_size=48, hidden_size=64)
    ids = random_prompt(1, 6, 48)
    expected = target.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=None)
    drafter = make_forced_drafter(target, [expected[0].tolist()], block_size=8, accept_all=True)
    generated = expected[0, ids.shape[1] :]
    drafter.set_draft_vocab(generated)  # every token it must draft: blocks accepted whole
    inside = dflash_generate(target, drafter, ids, max_new_tokens=30, stop_token_ids=[])
    assert torch.equal(inside.sequences, expected) and max(inside.stats.accept_lengths[0]) == 8
    outside = torch.ones(48, dtype=torch.bool).index_fill_(0, generated, False).nonzero()[:, 0]
    drafter.set_draft_vocab(outside)  # none of them: nothing is accepted, the target still decides every token
    excluded = dflash_generate(target, drafter, ids, max_new_tokens=30, stop_token_ids=[])
    assert torch.equal(excluded.sequences, expected) and set(excluded.stats.accept_lengths[0]) == {1}


def test_sampling_with_a_vocab_draws_drafts_only_from_it():
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    vocab = torch.arange(10, 30)
    drafter.set_draft_vocab(vocab)
    ids = random_prompt(2, 5)
    generator = torch.Generator().manual_seed(0)
    out = dflash_generate(target, drafter, ids, max_new_tokens=16, temperature=1.0, generator=generator)
    assert out.sequences.shape[1] <= ids.shape[1] + 16
    engine = engine_for(target, drafter)
    hidden = torch.randn(2, 4, target.config.hidden_size)
    probs = torch.softmax(engine.draft_head(hidden), dim=-1)
    outside = torch.ones(probs.shape[-1], dtype=torch.bool).index_fill_(0, vocab, False)
    assert probs[..., outside].sum() == 0 and torch.allclose(probs.sum(-1), torch.ones(2, 4))
