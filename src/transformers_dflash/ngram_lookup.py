"""Prompt lookup for one row: the continuation of the longest n-gram of the row's context that ends it.

The row's context is its prompt and every token it committed since. An index maps each n-gram (n = 1..max_n) to
where its most recent earlier occurrence continues, updated as tokens are committed (O(max_n) dict writes per
token), so a proposal costs max_n dict reads whatever the context's length. The most recent occurrence is taken:
in the repeating loops and copied code where lookup pays, the latest copy is the one being repeated.

Each row also keeps a record, per match length n, of how often the target accepted a looked-up token: the hybrid
proposer (`hybrid.py`) weighs lookup against the drafter with it.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_NGRAM = 4  # longest n-gram matched


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
        self.hits = [0] * (max_n + 1)  # per match length n: looked-up tokens the target accepted
        self.tries = [0] * (max_n + 1)  # ... and looked-up tokens the target judged (accepted + first rejected)
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

    def rate(self, n: int) -> float:
        """Estimated chance that a token looked up through an n-gram match is accepted: the record's mean with one
        accepted and one rejected token as a prior (0.5 before any evidence)."""
        return (self.hits[n] + 1) / (self.tries[n] + 2)

    def record(self, n: int, proposed: int, accepted: int) -> None:
        """Records that `accepted` of `proposed` tokens looked up through an n-gram match were accepted."""
        self.hits[n] += min(accepted, proposed)
        self.tries[n] += min(accepted + 1, proposed)
