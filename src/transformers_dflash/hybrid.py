"""Hybrid drafting: per row and step, the drafter's block or the prompt-lookup continuation, whichever is expected to
commit more tokens; one verify forward either way.

The drafter gains a token or two on most steps; lookup gains nothing on most steps and ten or more where the text
copies its context (code, quoted numbers, loops). For each row this module estimates the chance that each proposed
token is accepted, given the tokens before it are:

* drafter token k: the drafter's probability of its argmax at k (`c_k`);
* looked-up token k: the row's record for matches of that n-gram length (`NgramLookup.rate`, `r`); where it equals
  the drafter's argmax, both sources vouch for it: `1 - (1 - r)(1 - c_k)`;
* after the looked-up tokens (a short continuation), the drafter's tokens at those positions, at `c_k`.

The expected committed length of a proposal is `1 + sum_k prod_{i <= k} p_i`; the row takes lookup (its tokens,
then the drafter's) when that beats the drafter's block. The per-position chances feed `verify_length="auto"`,
which prices each verify width by its measured cost, exactly as for the drafter alone.

Lossless under sampling too: the choice reads the drafter's logits (its argmax and their probabilities) and the
row's committed context, never the sampled drafts, so each proposed token is drawn from a distribution fixed before
the draw: the drafter's (sampled drafts) or a point mass (looked-up tokens, whose `draft_probs` row becomes one-hot,
the deterministic-proposal case of `speculative_verify`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .ngram_lookup import NgramLookup

DRAFTER, LOOKUP = "drafter", "lookup"  # the proposer of a row's step, as `DFlashStats.proposers` records it


@dataclass
class Proposal:
    """What the target verifies this step, per row.

    Attributes:
        drafts: (b, k) proposed tokens after the anchor.
        draft_probs: (b, k, V) the distributions they were drawn from (sampling), or None (deterministic drafts).
        confidence: (b, k) the estimated chance of acceptance of each token (given the previous ones are).
        lookup_len: (b,) how many leading drafts are looked-up tokens (0: the drafter's block).
        ngram: per row, the n-gram length of the lookup match used (0: none).
    """

    drafts: torch.Tensor
    draft_probs: torch.Tensor | None
    confidence: torch.Tensor
    lookup_len: torch.Tensor
    ngram: list[int]


def lookup_candidates(
    lookups: list[NgramLookup], k: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Each row's lookup proposal as tensors: ids (b, k) (-1 past the continuation), lengths (b,), the record's
    acceptance estimate (b,), and the matched n-gram lengths."""
    ids = torch.full((len(lookups), k), -1, dtype=torch.long)
    lengths, rates, ngrams = [], [], []
    for r, lookup in enumerate(lookups):
        tokens, n = lookup.propose(k)
        ids[r, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        lengths.append(len(tokens))
        rates.append(lookup.rate(n) if n else 0.0)
        ngrams.append(n)
    to = {"device": device, "non_blocking": True}
    return ids.to(**to), torch.tensor(lengths).to(**to), torch.tensor(rates).to(**to), ngrams


def expected_length(confidence: torch.Tensor) -> torch.Tensor:
    """(b,) expected tokens committed by verifying every proposed token with these chances (b, k)."""
    return 1 + torch.cumprod(confidence, dim=1).sum(dim=1)


def hybrid_proposal(
    draft_logits: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    lookups: list[NgramLookup],
) -> Proposal:
    """Per row, the drafter's block or the lookup continuation followed by the drafter's tokens.

    Args:
        draft_logits: (b, k, V) the drafter's logits for the block after the anchor.
        drafts: (b, k) the drafter's drafts (its argmax, or samples from `draft_probs`).
        draft_probs: (b, k, V) the distributions the drafts were sampled from, or None.
        lookups: each row's [`NgramLookup`], its context up to the anchor.
    """
    b, k = drafts.shape
    probs = draft_logits.float().softmax(dim=-1)  # (b, k, V): the choice reads the drafter's own distribution
    c, best = probs.max(dim=-1)  # (b, k) its argmax and their probability, independent of any sampled draft
    ids, lengths, rates, ngrams = lookup_candidates(lookups, k, drafts.device)
    looked_up = torch.arange(k, device=drafts.device) < lengths[:, None]  # (b, k)
    r = rates[:, None]
    p_lookup = torch.where(looked_up, torch.where(ids == best, 1 - (1 - r) * (1 - c), r.expand(b, k)), c)  # (b, k)
    use = expected_length(p_lookup) > expected_length(c)  # (b,); False where there is no match
    from_lookup = looked_up & use[:, None]  # (b, k)
    if draft_probs is not None:
        point = torch.zeros_like(draft_probs).scatter_(-1, ids.clamp_min(0)[..., None], 1.0)
        draft_probs = torch.where(from_lookup[..., None], point, draft_probs)
    return Proposal(
        drafts=torch.where(from_lookup, ids, drafts),
        draft_probs=draft_probs,
        confidence=torch.where(use[:, None], p_lookup, c),
        lookup_len=from_lookup.sum(dim=1),
        ngram=ngrams,
    )
