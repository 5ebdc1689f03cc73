"""Hybrid drafting: per row and step, the drafter's block or the prompt-lookup continuation, whichever is expected to
commit more tokens; one verify forward either way.

The drafter gains a token or two on most steps; lookup gains nothing on most steps and ten or more where the text
copies its context (code, quoted numbers, loops). For each row this module estimates the chance that each proposed
token is accepted, given the tokens before it are:

* drafter token k: the drafter's probability of its argmax at k (`c_k`);
* looked-up token k: the row's record for matches of that n-gram length at position k (`NgramLookup.chances`,
  `r_k`: a prior measured on the target's own text, then the row's own hits); where it equals the drafter's argmax,
  both sources vouch for it: `1 - (1 - r_k)(1 - c_k)`;
* after the looked-up tokens (a short continuation), the drafter's tokens at those positions, at `c_k`.

The expected committed length of a proposal is `1 + sum_k prod_{i <= k} p_i`; the row takes lookup (its tokens,
then the drafter's) when that beats the drafter's block. The per-position chances feed `verify_length="auto"`,
which prices each verify width by its measured cost, exactly as for the drafter alone.

With `verify_length="auto"` a step may also skip the drafter (`DraftGate`): the lookup continuations' expected
tokens per second without a draft (a row without a match verifies its anchor alone, a plain decoding step) are
compared with what the recent draft steps were expected to give; the drafter runs when it is worth its cost, and
now and then (less often while it keeps losing) so that its estimate stays current. A skipped draft costs nothing later: the target
features of the skipped steps wait in the row's context and the next draft step reads them all.

Lossless under sampling too: the choice reads the drafter's logits (its argmax and their probabilities) and the
row's committed context, never the sampled drafts, so each proposed token is drawn from a distribution fixed before
the draw: the drafter's (sampled drafts) or a point mass (looked-up tokens, whose `draft_probs` row becomes one-hot,
the deterministic-proposal case of `speculative_verify`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .ngram_lookup import NgramLookup

# the proposer of a row's step, as `DFlashStats.proposers` records it: the drafter's tokens, looked-up tokens, or
# nothing (the anchor alone: a plain decoding step)
DRAFTER, LOOKUP, PLAIN = "drafter", "lookup", "plain"


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


class LookupCandidates(NamedTuple):
    """Each row's lookup continuation: on the device its ids (b, k) (-1 past it), lengths (b,) and the record's
    chance of acceptance per token (b, k) (0 past it); on the host the matched n-gram lengths (0: no match) and the
    chances (one per looked-up token)."""

    ids: torch.Tensor
    lengths: torch.Tensor
    chances: torch.Tensor
    ngrams: list[int]
    host_chances: list[list[float]]


def lookup_candidates(lookups: list[NgramLookup], k: int, device: torch.device) -> LookupCandidates:
    """Each row's lookup proposal as tensors: ids (b, k) (-1 past the continuation), lengths (b,), the record's
    chance of acceptance per token (b, k), and the matched n-gram lengths."""
    ids = torch.full((len(lookups), k), -1, dtype=torch.long)
    chances = torch.zeros(len(lookups), k)
    lengths, host_chances, ngrams = [], [], []
    for r, lookup in enumerate(lookups):
        tokens, n = lookup.propose(k)
        row = lookup.chances(n, len(tokens)) if n else []
        ids[r, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        chances[r, : len(row)] = torch.tensor(row)
        lengths.append(len(tokens))
        host_chances.append(row)
        ngrams.append(n)
    to = {"device": device, "non_blocking": True}
    device_lengths = torch.tensor(lengths).to(**to)
    return LookupCandidates(ids.to(**to), device_lengths, chances.to(**to), ngrams, host_chances)


def expected_length(confidence: torch.Tensor) -> torch.Tensor:
    """(b,) expected tokens committed by verifying every proposed token with these chances (b, k)."""
    return 1 + torch.cumprod(confidence, dim=1).sum(dim=1)


def hybrid_proposal(
    draft_logits: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    candidates: LookupCandidates,
) -> Proposal:
    """Per row, the drafter's block or the lookup continuation followed by the drafter's tokens.

    Args:
        draft_logits: (b, k, V) the drafter's logits for the block after the anchor.
        drafts: (b, k) the drafter's drafts (its argmax, or samples from `draft_probs`).
        draft_probs: (b, k, V) the distributions the drafts were sampled from, or None.
        candidates: each row's lookup continuation ([`lookup_candidates`]).
    """
    k = drafts.shape[1]
    probs = draft_logits.float().softmax(dim=-1)  # (b, k, V): the choice reads the drafter's own distribution
    c, best = probs.max(dim=-1)  # (b, k) its argmax and their probability, independent of any sampled draft
    ids, lengths, r, ngrams = candidates[:4]  # r: (b, k) the record's chances
    looked_up = torch.arange(k, device=drafts.device) < lengths[:, None]  # (b, k)
    p_lookup = torch.where(looked_up, torch.where(ids == best, 1 - (1 - r) * (1 - c), r), c)  # (b, k)
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


def lookup_proposal(candidates: LookupCandidates) -> Proposal:
    """The lookup continuations alone, for a step that skips the drafter: deterministic proposals (`draft_probs`
    None); a row without a match (or past its continuation) proposes filler tokens at chance 0, which the verify
    width chosen by their chances leaves out."""
    ids, lengths, chances, ngrams = candidates[:4]
    return Proposal(
        drafts=ids.clamp_min(0),
        draft_probs=None,
        confidence=chances,  # (b, k), 0 past each continuation
        lookup_len=lengths,
        ngram=ngrams,
    )


@dataclass
class DraftGate:
    """Whether a step runs the drafter, from the expected tokens per second of drafting and of lookup alone.

    The drafter also runs when it is due: every `explore_every` steps, so that its estimate follows the text; each
    such draft that loses to lookup doubles the interval (up to `max_explore_every`), one that wins resets it, so a
    drafter that does not help on this text costs little.

    Attributes:
        draft_rate: expected tokens per second of the recent draft steps (running average), None before the first.
        interval: the current exploration interval; skipped: steps since the last draft.
    """

    explore_every: int = 4
    max_explore_every: int = 32
    smoothing: float = 0.5
    draft_rate: float | None = None
    interval: int = 0
    skipped: int = 0
    _lookup_rate: float = 0.0

    def __post_init__(self) -> None:
        self.interval = self.interval or self.explore_every

    def should_draft(self, lookup_rate: float) -> bool:
        """True when drafting is expected to beat `lookup_rate` (tokens / s of lookup alone), or is due."""
        self._lookup_rate = lookup_rate
        return self.draft_rate is None or self.skipped + 1 >= self.interval or self.draft_rate >= lookup_rate

    def record(self, drafted: bool, rate: float = 0.0) -> None:
        """Records a step: whether it drafted, and then the expected tokens / s of its chosen width."""
        if not drafted:
            self.skipped += 1
            return
        won = rate >= self._lookup_rate
        self.interval = self.explore_every if won else min(2 * self.interval, self.max_explore_every)
        self.skipped = 0
        old = self.draft_rate
        self.draft_rate = rate if old is None else (1 - self.smoothing) * old + self.smoothing * rate


def lookup_rate(candidates: LookupCandidates, done: list[bool], costs: dict[int, float]) -> float:
    """Expected tokens per second of the best verify width when every running row verifies its lookup continuation
    and nothing is drafted; `costs` are the seconds of such a step per width."""
    widest = max(costs)
    expected = [0.0] * widest  # by verify width - 1: looked-up tokens verified, summed over the running rows
    for chances, finished in zip(candidates.host_chances, done, strict=True):
        total, kept = (0.0, 0.0) if finished else (1.0, 1.0)  # expected tokens so far; chance all so far are kept
        for j in range(widest):
            expected[j] += total
            kept *= chances[j] if j < len(chances) else 0.0
            total += kept
    return max(expected[w - 1] / seconds for w, seconds in costs.items())


class HybridRows:
    """Hybrid drafting's host state for the rows of one request: each row's n-gram index and lookup record, what
    its last proposal looked up, and the draft gate. The engine calls it at the host sync of each step: `commit`
    per row, `keep` when finished rows leave the batch, `propose_lookup` and `should_draft` before the step,
    `verified` after it.

    Args:
        contexts: each row's tokens so far (its prompt without padding).
    """

    def __init__(self, contexts: list[list[int]]) -> None:
        self.lookups = [NgramLookup(context) for context in contexts]
        self.led = [(0, 0)] * len(contexts)  # per row: (n-gram length, looked-up tokens verified) of its last step
        self.gate = DraftGate()

    def commit(self, row: int, tokens: list[int]) -> bool:
        """Appends `row`'s newly committed tokens to its context and records how many of the looked-up tokens its
        last proposal led with were accepted; True when that proposal led with lookup."""
        self.lookups[row].extend(tokens)
        n, proposed = self.led[row]
        if proposed and tokens:
            self.lookups[row].record(n, proposed, len(tokens) - 1)  # the last committed token is the target's own
        return bool(proposed)

    def keep(self, rows: list[int]) -> None:
        """Keeps only `rows` (in this order), as the engine does when finished rows leave the batch."""
        self.lookups, self.led = [self.lookups[r] for r in rows], [self.led[r] for r in rows]

    def propose_lookup(self, k: int, device: torch.device) -> LookupCandidates:
        """Each row's lookup continuation of `k` tokens ([`lookup_candidates`])."""
        return lookup_candidates(self.lookups, k, device)

    def should_draft(self, candidates: LookupCandidates, done: list[bool], costs: dict[int, float]) -> bool:
        """Whether this step runs the drafter (the gate, against lookup alone at `costs` per width without a draft)."""
        return self.gate.should_draft(lookup_rate(candidates, done, costs))

    def verified(self, ngrams: list[int], lookup_tokens: list[int]) -> None:
        """Notes, per row, the n-gram length of this step's lookup and how many looked-up tokens were verified."""
        self.led = list(zip(ngrams, lookup_tokens, strict=True))
