"""How the engine turns logits into tokens: greedy, warped sampling, or Transformers' logits processors.

The acceptance rules themselves live in `verify.py`; this module only decides which one applies and feeds it:

* greedy (temperature 0): argmax drafts, `greedy_verify`;
* sampling: the target's probabilities are `warp_logits(temperature, top_k, top_p)`; drafts are either the drafter's
  argmax (deterministic draft, `speculative_verify(draft_probs=None)`: accept while the target's sample matches) or
  samples from the drafter's warped probabilities (`draft="sample"`, the default: proper speculative sampling,
  which accepts more for a calibrated drafter, see `benchmarks/engine.md`). Both are lossless;
* processors (the `custom_generate` path with processors other than temperature/top-k/top-p): the target's logits
  at each block position go through the processors with that position's own prefix, as `generate` would see it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from .verify import greedy_verify, speculative_verify, warp_logits

DRAFT_RULES = ("argmax", "sample")


@dataclass
class TokenRule:
    """Token choice shared by the first token, the draft and the verification.

    Attributes:
        temperature: 0 for greedy; otherwise the sampling temperature (with `top_k`, `top_p`).
        draft: when sampling, "sample" (drafts sampled from the drafter) or "argmax" (deterministic drafts).
        processors: Transformers logits processors applied per position (then `temperature` etc. are unused and
            `do_sample` picks argmax or sampling of the processed scores).
        generator: RNG for every random draw, for reproducible sampling.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    draft: str = "sample"
    processors: LogitsProcessorList | None = None
    do_sample: bool = False
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = no top-k filter), got {self.top_k}.")
        if self.draft not in DRAFT_RULES:
            raise ValueError(f"draft must be one of {DRAFT_RULES}, got {self.draft!r}.")
        if self.processors is None:
            self.do_sample = self.temperature > 0

    @classmethod
    def from_generate(cls, processors: LogitsProcessorList, do_sample: bool, draft: str = "sample") -> TokenRule:
        """The rule for the processors `generate` prepared: vectorised when they are only the standard warpers."""
        warpers = {TemperatureLogitsWarper: "temperature", TopKLogitsWarper: "top_k", TopPLogitsWarper: "top_p"}
        if not all(type(p) in warpers for p in processors):
            return cls(processors=processors, do_sample=do_sample)
        settings = {"temperature": 1.0 if do_sample else 0.0}
        settings.update({warpers[type(p)]: getattr(p, warpers[type(p)]) for p in processors if do_sample})
        return cls(**settings, draft=draft)

    def _probs(self, scores: torch.Tensor) -> torch.Tensor:
        """Sampling probabilities (float32) of raw logits, or of already processed scores."""
        if self.processors is not None:
            return scores.float().softmax(dim=-1)
        return warp_logits(scores, self.temperature, self.top_k, self.top_p)

    def _sample(self, probs: torch.Tensor) -> torch.Tensor:
        """One draw per row of `probs` (..., V) -> (...)."""
        flat = probs.reshape(-1, probs.shape[-1])
        return torch.multinomial(flat, 1, generator=self.generator).view(probs.shape[:-1])

    def _process(self, logits: torch.Tensor, prefixes: list[torch.Tensor], verify_ids: torch.Tensor) -> torch.Tensor:
        """Processed scores (b, w, V): position j of row r sees `prefixes[r]` then `verify_ids[r, 1 : j + 1]`.

        Processors get the whole batch, as in `generate` (some keep per-row state such as each row's padding), but
        rows advance unevenly, so each call serves the rows whose history has one length; the others' are dummies.
        """
        histories = [torch.cat([prefix, verify_ids[r, 1:]]) for r, prefix in enumerate(prefixes)]
        scores = torch.empty_like(logits, dtype=torch.float32)
        for j in range(logits.shape[1]):
            lengths = [len(prefix) + j for prefix in prefixes]
            for length in sorted(set(lengths)):
                batch = torch.stack(
                    [h[:length] if len(h) >= length else F.pad(h, (length - len(h), 0)) for h in histories]
                )
                served = [r for r, n in enumerate(lengths) if n == length]
                scores[served, j] = self.processors(batch, logits[:, j].to(torch.float32, copy=True))[served]
        return scores

    def first_token(self, logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """(b,) the token after the prompt, from the target's last-position logits (b, V)."""
        scores = logits if self.processors is None else self.processors(input_ids, logits.to(torch.float32, copy=True))
        return self._sample(self._probs(scores)) if self.do_sample else scores.argmax(dim=-1)

    def propose(self, draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Drafts (b, k) from the drafter's logits (b, k, V), and the probabilities (b, k, V) they were sampled from,
        or None for deterministic (argmax) drafts."""
        if self.do_sample and self.processors is None and self.draft == "sample":
            probs = self._probs(draft_logits)  # (b, k, V)
            return self._sample(probs), probs
        return draft_logits.argmax(dim=-1), None

    def confidence(self, draft_logits: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """(b, k) the drafter's probability of each of its drafts (warped like the target's when sampling)."""
        sampling = self.do_sample and self.processors is None
        probs = self._probs(draft_logits) if sampling else draft_logits.float().softmax(dim=-1)
        return probs.gather(-1, drafts[..., None])[..., 0]

    def accept(
        self,
        verify_ids: torch.Tensor,
        target_logits: torch.Tensor,
        draft_probs: torch.Tensor | None,
        prefixes: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Accepted draft count (b,) and the target's next token (b,) for `verify_ids` = [anchor, drafts] (b, w).

        `target_logits` (b, w, V) are the target's at each verified position; `prefixes` (processors only) are each
        row's committed tokens (prompt with its padding, then generated tokens up to the anchor).
        """
        drafts = verify_ids[:, 1:]
        if self.processors is not None:
            target_logits = self._process(target_logits, prefixes, verify_ids)
        if not self.do_sample:
            return greedy_verify(drafts, target_logits)
        return speculative_verify(drafts, self._probs(target_logits), draft_probs, generator=self.generator)
