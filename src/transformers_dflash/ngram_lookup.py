"""Prompt lookup for one row: the continuation of the longest n-gram of the row's context that ends it.

The row's context is its prompt and every token it committed since. An index maps each n-gram (n = 1..max_n) to
where its most recent earlier occurrence continues, updated as tokens are committed (O(max_n) dict writes per
token), so a proposal costs max_n dict reads whatever the context's length. The most recent occurrence is taken:
in the repeating loops and copied code where lookup pays, the latest copy is the one being repeated.

Each row also keeps a record, per match length n and position in the continuation, of how often the target
accepted a looked-up token (given the ones before it were): the hybrid proposer (`hybrid.py`) weighs lookup against
the drafter with it. Before any evidence the record holds `PRIOR`, measured on the embedded target's own responses:
a looked-up token is right far more often after a long match than after a short one (0.24 after one matching token,
0.97 after eight: a loop), and each further token more often than the first.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_NGRAM = 8  # longest n-gram matched; a match of 8 tokens is nearly always a loop or a copy
POSITIONS = 4  # the record's positions in a continuation: 0, 1, 2 and 3 onwards
# Chance that a looked-up token is right given the ones before it were, by match length n (row n - 1) and position
# (0, 1, 2, 3+): `python benchmarks/lookup_prior.py --every 25` on 287 responses of the shared H200 set (every
# response position; SmolLM2-135M-Instruct's own greedy text: ShareGPT, GSM8K, code, stdlib prompts).
PRIOR = (
    (0.24, 0.61, 0.66, 0.84),
    (0.59, 0.66, 0.75, 0.88),
    (0.65, 0.75, 0.80, 0.89),
    (0.72, 0.80, 0.80, 0.91),
    (0.79, 0.80, 0.88, 0.92),
    (0.79, 0.87, 0.88, 0.92),
    (0.87, 0.87, 0.92, 0.92),
    (0.97, 0.97, 0.97, 0.98),
)
PRIOR_WEIGHT = 4.0  # pseudo-observations behind each prior chance: a row's own record outweighs it after a few steps


class NgramLookup:
    """The n-gram index and lookup record of one row.

    Args:
        context: the row's tokens so far (prompt without padding, then generated).
        max_n: the longest n-gram matched; shorter ones are tried down to 1.
    """

    def __init__(self, context: Iterable[int], max_n: int = MAX_NGRAM) -> None:
        self.max_n = max_n
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its latest occurrence
        # per match length n and position: looked-up tokens the target accepted, and the ones it judged (accepted,
        # or the first rejected)
        self.hits = [[0] * POSITIONS for _ in range(max_n + 1)]
        self.tries = [[0] * POSITIONS for _ in range(max_n + 1)]
        self.extend(context)

    def extend(self, tokens: Iterable[int]) -> None:
        """Appends committed tokens and indexes the n-grams they complete."""
        for token in tokens:
            end = len(self.tokens)  # every n-gram ending just before `token` continues at `end`
            for n in range(1, min(self.max_n, end) + 1):
                self._next[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(int(token))

    def propose(self, k: int) -> tuple[list[int], int]:
        """`k` tokens continuing the longest n-gram that ends the context, and that n; ([], 0) without a match.

        The continuation is the text after the n-gram's latest earlier occurrence; where that text runs into the end
        of the context, it repeats (a loop of period p proposes its next k tokens, not only the p it has seen)."""
        for n in range(min(self.max_n, len(self.tokens)), 0, -1):
            start = self._next.get(tuple(self.tokens[-n:]))
            if start is not None:  # a continuation that reaches the end repeats with the period it implies
                period = len(self.tokens) - start
                return [self.tokens[start + i % period] for i in range(k)], n
        return [], 0

    def chances(self, n: int, k: int) -> list[float]:
        """Estimated chance that each of `k` tokens looked up through an n-gram match is accepted, given the ones
        before it are: the record's mean with `PRIOR` as `PRIOR_WEIGHT` pseudo-observations."""
        prior = PRIOR[min(n, len(PRIOR)) - 1]
        hits, tries = self.hits[n], self.tries[n]
        by_position = [(hits[p] + PRIOR_WEIGHT * prior[p]) / (tries[p] + PRIOR_WEIGHT) for p in range(POSITIONS)]
        return [by_position[min(j, POSITIONS - 1)] for j in range(k)]

    def record(self, n: int, proposed: int, accepted: int) -> None:
        """Records that the target accepted `accepted` of `proposed` tokens looked up through an n-gram match: each
        accepted one and the first rejected one were judged."""
        for j in range(min(accepted + 1, proposed)):
            self.tries[n][min(j, POSITIONS - 1)] += 1
            self.hits[n][min(j, POSITIONS - 1)] += j < accepted
