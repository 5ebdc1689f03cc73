"""The engine's sampling is lossless: its first tokens follow the target's exact (warped) distribution.

With a 10-token vocabulary the joint law of the first three new tokens (1000 cells) is computed exactly from the
target; thousands of rows of one batch are independent samples of it. A chi-square test (cells with expected count
< 5 pooled) must not reject it at level 1e-3; the same samples must reject a nearby wrong law (power check). The
seed is fixed, so the test is deterministic.
"""

import itertools

import pytest
import torch
from conftest import ForcedAcceptanceDrafter, make_drafter, make_target, random_prompt

from transformers_dflash import ngram_lookup
from transformers_dflash.engine import dflash_generate
from transformers_dflash.verify import warp_logits

VOCAB, NEW, ROWS = 10, 3, 6000


class SoftForcedDrafter(ForcedAcceptanceDrafter):
    """The forced drafter with logits / 10: its distribution is spread (0.45 on its pick), so sampled drafts vary
    and often fall outside the target's top-k / top-p set."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.last_hidden_state = out.last_hidden_state * 0.1  # lm_head is linear: logits 20 -> 2
        return out


def soft_forced_drafter(target, prompt: torch.Tensor, rows: int) -> SoftForcedDrafter:
    """A [`SoftForcedDrafter`] that proposes the target's greedy continuation of `prompt` for every row."""
    with torch.no_grad():
        greedy = target.generate(prompt, do_sample=False, max_new_tokens=NEW + 4, eos_token_id=None)[0].tolist()
    drafter = SoftForcedDrafter(make_drafter(target, block_size=4).config, target.get_output_embeddings().weight)
    drafter.references = [greedy] * rows
    return drafter.eval()


def exact_joint(target, prompt: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """(V,) * NEW tensor of the probability of each sequence of NEW tokens after `prompt` (1, P)."""
    joint = torch.ones(())
    for depth in range(NEW):
        prefixes = list(itertools.product(range(VOCAB), repeat=depth))
        ids = torch.cat(
            [prompt.expand(len(prefixes), -1), torch.tensor(prefixes, dtype=torch.long).view(len(prefixes), depth)], 1
        )
        with torch.no_grad():
            logits = target(ids).logits[:, -1]  # (V^depth, V)
        step = warp_logits(logits, temperature, top_k, top_p).view(*([VOCAB] * depth), VOCAB)
        joint = joint[..., None] * step
    return joint


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """P-value of Pearson's chi-square test of `counts` against `probs`, sparse cells pooled into one."""
    expected = probs.flatten().double() * counts.sum()
    counts = counts.flatten().double()
    sparse = expected < min_expected
    observed = torch.cat([counts[~sparse], counts[sparse].sum()[None]])
    expected = torch.cat([expected[~sparse], expected[sparse].sum()[None]])
    observed, expected = observed[expected > 0], expected[expected > 0]
    statistic = ((observed - expected) ** 2 / expected).sum()
    degrees = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2.0), statistic / 2))


@pytest.mark.parametrize(
    ("draft", "temperature", "top_k", "top_p", "lookup", "verify_length"),
    [
        ("argmax", 1.0, 0, 1.0, False, None),
        ("sample", 1.0, 0, 1.0, False, None),
        ("argmax", 0.8, 6, 0.9, False, None),
        ("sample", 0.8, 6, 0.9, False, None),
        ("sample", 0.8, 6, 0.9, True, None),
        ("sample", 1.0, 0, 1.0, True, "auto"),
    ],
    ids=[
        "argmax-drafts",
        "sampled-drafts",
        "argmax-drafts-topk-topp",
        "sampled-drafts-topk-topp",
        "hybrid-sampled-drafts-topk-topp",
        "hybrid-auto-sampled-drafts",
    ],
)
def test_samples_follow_the_targets_distribution(draft, temperature, top_k, top_p, lookup, verify_length, monkeypatch):
    """Hybrid drafting mixes sampled drafts with looked-up tokens (point masses) in one proposal; with
    `verify_length="auto"` some steps skip the drafter and verify lookup alone. Looked-up tokens are made likely
    winners here (a confident lookup prior: this short text has only 1-gram matches, which the measured prior
    rarely trusts), so that the law is checked on steps that propose them."""
    monkeypatch.setattr(ngram_lookup, "PRIOR", ((0.9,) * ngram_lookup.POSITIONS,) * ngram_lookup.MAX_NGRAM)
    target = make_target("qwen3", vocab_size=VOCAB, hidden_size=32, seed=3)
    with torch.no_grad():  # milder logits than conftest's, so that several tokens are likely at each step
        for p in target.parameters():
            p.mul_(0.5 if p.dim() == 2 else 1.0)
    prompt = random_prompt(1, 4, VOCAB)
    drafter = soft_forced_drafter(target, prompt, ROWS)
    generator = torch.Generator().manual_seed(0)
    out = dflash_generate(
        target, drafter, prompt.repeat(ROWS, 1), max_new_tokens=NEW, temperature=temperature, top_k=top_k,
        top_p=top_p, stop_token_ids=[], generator=generator, draft=draft, lookup=lookup, verify_length=verify_length,
    )  # fmt: skip
    new = out.sequences[:, prompt.shape[1] :]  # (ROWS, NEW)
    counts = torch.bincount((new * torch.tensor([VOCAB**2, VOCAB, 1])).sum(1), minlength=VOCAB**NEW).view(
        *[VOCAB] * NEW
    )
    histogram = out.stats.histogram
    assert histogram[1] > 100 and histogram[2] > 100  # both rejections and accepted drafts were exercised
    if lookup:
        assert out.stats.proposer_share.get("lookup", 0) > 0.1  # looked-up tokens were proposed and judged

    truth = exact_joint(target, prompt, temperature, top_k, top_p)
    assert chi_square_p_value(counts, truth) > 1e-3
    wrong = exact_joint(target, prompt, temperature * 1.3, top_k, top_p)  # power: a nearby wrong law fails
    assert chi_square_p_value(counts, wrong) < 1e-6
