"""The fast DFlash decoding loop: batched, static caches written by position, one host sync per step.

One request, top to bottom (`DFlashEngine.generate`):

    prefill    target(prompt) -> first token + context features of the prompt
    loop       drafter([anchor, MASK x (B-1)], new context features) -> B-1 drafts
               target([anchor, drafts]) -> logits + features; verify.py accepts n drafts + 1 target token
               commit per row (cut at stop ids / max_new_tokens), sync the counts to the host once, stream
    output     prompt + generated tokens, padded after each row's end, like `generate`

Both caches are `SlotCache`s preallocated for prompt + max_new_tokens + block: slot == token position, so a row's
rejected tokens are overwritten by its next step and rows of a batch advance independently. The target's slots
before the anchor hold committed tokens; the drafter's hold the committed context, and the block it writes after the
anchor is overwritten by the next step's context. Masks are built here: target query at position p sees slots <= p,
the drafter's block sees slots < anchor + B.

Why this file is over 400 lines: it keeps the whole loop readable top to bottom, with the two forward passes and
the commit it calls (as gpt-fast's generate.py does), and the few lines by which AR (no drafter) and hybrid drafting
(`lookup=True`) ride the same loop; everything with a concept of its own lives beside it (`engine_rows`,
`static_cache`, `token_rule`, `verify`, `adaptive`, `hybrid`, `ngram_lookup`, `stats`, `validation`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from transformers import PreTrainedModel, StoppingCriteria
from transformers.generation.streamers import BaseStreamer

from .adaptive import StepCosts, best_width, candidate_widths, expected_tokens, measure_step_costs
from .compat import cache_kwarg
from .compiled_steps import compiled_steps
from .draft_vocab import DraftHead
from .drafter_types import as_native_drafter
from .engine_rows import _Rows, cut_at_criteria
from .hybrid import DRAFTER, LOOKUP, PLAIN, HybridRows, hybrid_proposal, lookup_proposal
from .modeling_dflash import additive_attention_mask, extract_context_features, hidden_state_indices
from .pair_check import check_pair
from .special_ids import pad_token_id_of, stop_token_ids_of
from .static_cache import SlotCache
from .stats import DFlashStats, Stopwatch
from .token_rule import TokenRule
from .validation import check_engine_pair, check_request

__all__ = ["DFlashEngine", "DFlashOutput", "dflash_generate", "engine_for"]

_ENGINE_ATTR = "_dflash_engine"
_COMPILED_CAPACITY_STEP = 256  # cache slots are allocated in multiples of this when compiled


@dataclass
class DFlashOutput:
    """`sequences` (b, prompt + new), padded with the pad id after each row's end; `stats` (None unless asked)."""

    sequences: torch.LongTensor
    stats: DFlashStats | None = None


class DFlashEngine:
    """DFlash speculative decoding of `target` with `drafter`; keeps caches (and compiled steps) across calls.

    Args:
        target: a Llama-like causal LM (full attention, `sdpa` or `eager`).
        drafter: a DFlash drafter for it (ours, or a z-lab remote-code instance); None decodes plain AR on the same
            loop, caches and steps (blocks of one token, the anchor: see `ar.py`).
        compile: `torch.compile` the fixed-shape draft and verify steps with `fullgraph=True` (CUDA:
            `mode="reduce-overhead"`, CUDA graphs); a dict adds to or overrides those options (e.g.
            `{"backend": "aot_eager"}`).
    """

    def __init__(
        self, target: PreTrainedModel, drafter: nn.Module | None, compile: bool | dict[str, Any] = False
    ) -> None:
        self.target, self.drafter = target, None if drafter is None else as_native_drafter(drafter)
        check_engine_pair(target, self.drafter)
        self.layer_ids = [] if drafter is None else list(self.drafter.config.target_layer_ids)
        self.embed, self.lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        self.target_cache: SlotCache | None = None
        self.draft_cache: SlotCache | None = None
        self.step_costs: dict[tuple[int, int], StepCosts] = {}
        self.draft_head = DraftHead()  # the target's head, over the drafter's draft vocabulary if it has one
        self._target_cache_kwarg = cache_kwarg(target.forward)
        self._draft_cache_kwarg = None if drafter is None else cache_kwarg(self.drafter.forward)
        self.compiled = compile
        self._draft_step, self._verify_step = compiled_steps(self._draft, self._target_forward, target.device, compile)

    # ---- the two forward passes -----------------------------------------------------------------------------

    def _target_forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        logits_to_keep: int = 0,
        reach: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Target logits (b, t | keep, V) and context features (b, t, F * H) of `ids` (b, t) at `positions`.

        `reach`: attention reads only the cache's first `reach` slots (every query position is below it); None:
        the whole cache."""
        cache = self.target_cache
        cache.write_at(slots, reach)
        slot_ids = torch.arange(reach or cache.capacity, device=ids.device)
        mask = (slot_ids <= positions[..., None])[:, None]  # (b, 1, t, T)
        if self.target.config.get_text_config()._attn_implementation == "eager":
            mask = additive_attention_mask(mask, self.lm_head.weight.dtype)
        out = self.target(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            output_hidden_states=hidden_state_indices(self.layer_ids) if self.layer_ids else False,
            logits_to_keep=logits_to_keep,
            **{self._target_cache_kwarg: cache},
        )
        if not self.layer_ids:  # AR: no drafter to feed
            return out.logits, out.logits.new_zeros(*ids.shape, 0)
        return out.logits, extract_context_features(out.hidden_states, self.layer_ids)

    def _draft(
        self,
        anchor: torch.Tensor,
        anchor_pos: torch.Tensor,
        context: torch.Tensor,
        context_pos: torch.Tensor,
        context_slots: torch.Tensor,
        block_size: int,
        reach: int | None = None,
    ) -> torch.Tensor:
        """Drafter logits (b, B - 1, V) for the block after `anchor`, given the new `context` (b, n, F * H).

        `reach`: as in `_target_forward` (every block position is below it)."""
        cache, b = self.draft_cache, anchor.shape[0]
        block_pos = anchor_pos[:, None] + torch.arange(block_size, device=anchor.device)  # (b, B)
        mask_ids = torch.full((b, block_size - 1), self.drafter.config.mask_token_id, device=anchor.device)
        noise = self.embed(torch.cat([anchor[:, None], mask_ids], dim=1))  # (b, B, H)
        cache.write_at(torch.cat([context_slots, block_pos], dim=1), reach)
        slot_ids = torch.arange(reach or cache.capacity, device=anchor.device)
        visible = slot_ids < (anchor_pos + block_size)[:, None]  # (b, T)
        hidden = self.drafter(
            noise_embeds=noise,
            context_hidden_states=context,
            position_ids=torch.cat([context_pos, block_pos], dim=1),
            attention_mask=visible[:, None, None, :],
            **{self._draft_cache_kwarg: cache},
        ).last_hidden_state  # (b, B, H)
        # The head reads all B rows and drops the anchor's: MKL's fp32 GEMM of the 576 x 49152 head costs 2.8x more
        # for 15 rows than for 16 on a 2-core Xeon (benchmarks/engine.md), and one extra row is noise elsewhere.
        return self.draft_head(hidden)[:, 1:]  # -inf outside the drafter's draft vocabulary, if it has one

    # ---- one request ------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 256,
        rule: TokenRule | None = None,
        stop_token_ids: list[int] | None = None,
        streamer: BaseStreamer | None = None,
        block_size: int | None = None,
        verify_length: int | str | None = None,
        return_stats: bool = True,
        stopping_criteria: list[StoppingCriteria] | None = None,
        stream_prompt: bool = True,
        lookup: bool = False,
    ) -> DFlashOutput:
        """Decodes every row of `input_ids` (b, P), left-padded per `attention_mask`; see [`dflash_generate`].

        `stopping_criteria` are extra Transformers criteria checked per row on each committed prefix (the
        `custom_generate` path); `stream_prompt=False` when the caller already streamed the prompt. Rows that
        finish leave the batch (unless the steps are compiled or logits processors hold per-row state). `lookup`:
        hybrid drafting (`hybrid.py`), each row's step proposes the drafter's block or its prompt-lookup continuation.
        """
        if self.drafter is not None:
            check_pair(self.target, self.drafter)  # cached per pair; redone if a model moved since the last call
            self.draft_head.update(self.lm_head, getattr(self.drafter, "draft_vocab", None))
        rule = rule or TokenRule()
        block_size = 1 if self.drafter is None else block_size or self.drafter.config.block_size  # 1: AR, no drafts
        mask = check_request(
            self.target, input_ids, attention_mask, max_new_tokens, block_size, verify_length, streamer,
            drafts=self.drafter is not None,
        )  # fmt: skip
        device, (b, prompt_len) = self.target.device, input_ids.shape
        input_ids, mask = input_ids.to(device), mask.to(device)
        stop_ids = torch.tensor(stop_token_ids_of(self.target, stop_token_ids), dtype=torch.long, device=device)
        capacity = prompt_len + max_new_tokens + block_size + 1  # every position a block can reach, then the sink
        if self.compiled:  # compiled steps have the cache's shape: round it up, so that most requests reuse one
            capacity = -(-capacity // _COMPILED_CAPACITY_STEP) * _COMPILED_CAPACITY_STEP
        self._allocate(b, capacity)
        stats = DFlashStats(block_size, [[] for _ in range(b)], cache_bytes=self.cache_bytes)
        watch, start = Stopwatch(device), time.perf_counter()
        if streamer is not None and stream_prompt:
            streamer.put(input_ids.cpu())

        with watch.lap("prefill"):
            positions = (mask.cumsum(dim=1) - 1).clamp_min(0)  # (b, P) real positions
            slots = positions.masked_fill(mask == 0, self.target_cache.sink)  # pads go to the sink (same slot in both)
            reach = self._reach(prompt_len)  # prefill positions are below the prompt's width
            logits, features = self._target_forward(input_ids, positions, slots, logits_to_keep=1, reach=reach)
            first = rule.first_token(logits[:, -1], input_ids)  # (b,)
            rows = _Rows(
                anchor=first,
                anchor_pos=mask.sum(dim=1),
                generated=torch.ones(b, dtype=torch.long, device=device),
                done=torch.isin(first, stop_ids) | (max_new_tokens == 1),
                tokens=torch.zeros(b, max_new_tokens + block_size, dtype=torch.long, device=device),
                context=features,
                context_pos=positions,
                context_slots=slots,
            )
            rows.tokens[:, 0] = first
        host = torch.stack([rows.done.long(), rows.generated, first], dim=1).tolist()  # per row [done, n, *tokens]
        # hybrid drafting: each row's n-gram index over its context (the loop adds each step's tokens), its lookup
        # record, and the draft gate
        hybrid = HybridRows([input_ids[r][mask[r].bool()].tolist() for r in range(b)]) if lookup else None
        generated = [0] * b  # host copy of rows.generated
        prompt_lens = rows.anchor_pos.tolist()  # host copies: each row's anchor is at prompt_lens + generated - 1
        origin, outputs = list(range(b)), {}  # each row's index in the input; finished rows' new tokens
        reach = self._reach(max(prompt_lens) + 1 + block_size)  # the first step's (see the loop)
        costs = self._step_costs(rows, block_size, reach) if verify_length == "auto" else None
        arange = torch.arange(block_size, device=device)
        compact = not self.compiled and rule.processors is None  # else the batch keeps its shape (fixed graphs,
        # or processors that hold per-row state such as each row's padding)
        step_start = time.perf_counter()  # a step runs from one host sync to the next

        while True:
            if stopping_criteria:
                cut_at_criteria(stopping_criteria, input_ids[origin], generated, host, rows)
            for r, (_, count, *_tokens) in enumerate(host):
                generated[r] += count
                if stats.verify_widths and count:
                    stats.accept_lengths[origin[r]].append(count)
                if hybrid is not None:
                    looked_up = hybrid.commit(r, host[r][2 : 2 + count])
                    if stats.verify_widths and count:
                        stats.proposers[origin[r]].append(
                            LOOKUP if looked_up else DRAFTER if stats.verify_widths[-1] > 1 else PLAIN
                        )
            if streamer is not None and host[0][1]:
                streamer.put(torch.tensor(host[0][2 : 2 + host[0][1]]))
            finished = [r for r, (done, *_) in enumerate(host) if done]
            if len(finished) == len(host):
                break
            if finished and compact:
                outputs.update({origin[r]: rows.tokens[r, : generated[r]] for r in finished})
                keep = [r for r, (done, *_) in enumerate(host) if not done]
                index = torch.tensor(keep, device=device)
                rows = rows.select(index)
                for cache in (self.target_cache, self.draft_cache):
                    if cache is not None:
                        cache.keep_rows(index)
                host, generated, origin = ([x[r] for r in keep] for x in (host, generated, origin))
                if hybrid is not None:
                    hybrid.keep(keep)

            furthest = max(prompt_lens[o] + n for o, n in zip(origin, generated, strict=True))  # > every anchor
            reach = self._reach(furthest + block_size)  # beyond the furthest block
            # AR (no drafter): the block is the anchor alone, no drafts (b, 0), no draft probabilities
            drafts, draft_probs = rows.anchor.new_zeros(rows.anchor.shape[0], 0), None
            drafting = self.drafter is not None
            if hybrid is not None:  # the lookup continuations, and whether the drafter is worth running
                candidates = hybrid.propose_lookup(block_size - 1, device)
                if costs is not None:
                    done = [bool(row[0]) for row in host]
                    drafting = hybrid.should_draft(candidates, done, costs.costs(drafting=False))
                if not drafting:
                    proposal = lookup_proposal(candidates)
                    drafts, confidence = proposal.drafts, proposal.confidence
            if drafting:
                step_draft = self._draft_step if rows.context.shape[1] == block_size else self._draft
                with watch.lap("draft"):
                    inputs = (rows.anchor, rows.anchor_pos, rows.context, rows.context_pos, rows.context_slots)
                    draft_logits = step_draft(*inputs, block_size, reach)  # (b, B - 1, V)
                    drafts, draft_probs = rule.propose(draft_logits)  # (b, B - 1), (b, B - 1, V) | None
                    if hybrid is not None:
                        proposal = hybrid_proposal(draft_logits, drafts, draft_probs, candidates)
                        drafts, draft_probs, confidence = proposal.drafts, proposal.draft_probs, proposal.confidence
                    elif verify_length == "auto":
                        confidence = rule.confidence(draft_logits, drafts)  # (b, B - 1)
            if verify_length == "auto":  # a second host sync: the width is a shape
                width, rate = best_width(expected_tokens(confidence, rows.done), costs.costs(drafting))
                if hybrid is not None:
                    hybrid.gate.record(drafting, rate)
            else:
                width = block_size if verify_length is None else verify_length + 1
            with watch.lap("verify"):
                verify_ids = torch.cat([rows.anchor[:, None], drafts[:, : width - 1]], dim=1)  # (b, w)
                positions = rows.anchor_pos[:, None] + arange[:width]  # (b, w)
                # logits (b, w, V), features (b, w, F * H)
                logits, features = self._verify_step(verify_ids, positions, positions, reach=reach)
                prefixes = None
                if rule.processors is not None:
                    prefixes = [
                        torch.cat([input_ids[o], rows.tokens[r, : generated[r]]]) for r, o in enumerate(origin)
                    ]
                if draft_probs is not None:
                    draft_probs = draft_probs[:, : width - 1]
                accepted, next_token = rule.accept(verify_ids, logits, draft_probs, prefixes)  # (b,), (b,)
            committed, n_new = self._commit(rows, verify_ids, accepted, next_token, stop_ids, max_new_tokens)
            if self.drafter is not None:
                context = F.pad(features, (0, 0, 0, block_size - width))  # (b, B, F * H): fixed draft shape
                context_pos = positions[:, :1] + arange  # (b, B)
                context_slots = context_pos.masked_fill(arange >= n_new[:, None], self.draft_cache.sink)
                if not drafting:  # the drafter has not read the context yet: it waits for the next draft step
                    context = torch.cat([rows.context, context], dim=1)  # (b, n + B, F * H)
                    context_pos = torch.cat([rows.context_pos, context_pos], dim=1)
                    context_slots = torch.cat([rows.context_slots, context_slots], dim=1)
                rows.context, rows.context_pos, rows.context_slots = context, context_pos, context_slots
            stats.verify_widths.append(width)
            stats.draft_steps += drafting
            synced = [rows.done[:, None].long(), n_new[:, None], committed]  # (b, 1), (b, 1), (b, w)
            if hybrid is not None:
                synced.append(proposal.lookup_len.clamp_max(width - 1)[:, None])  # (b, 1): the lookup tokens verified
            host = torch.cat(synced, dim=1).tolist()  # the sync: per row [done, n, *tokens(w), lookup tokens?]
            if hybrid is not None:
                hybrid.verified(proposal.ngram, [row[-1] for row in host])
            now = time.perf_counter()
            if costs is not None and len(host) == b:  # real step times correct the costs (of the full batch)
                costs.observe(width, now - step_start, drafting)
            step_start = now

        outputs.update({origin[r]: rows.tokens[r, : generated[r]] for r in range(len(host))})
        new_tokens = [outputs[r] for r in range(b)]
        pad = pad_token_id_of(self.target)
        sequences = torch.cat([input_ids, pad_sequence(new_tokens, batch_first=True, padding_value=pad)], dim=1)
        if streamer is not None:
            streamer.end()
        times = watch.totals()
        stats.total_s, stats.new_tokens = time.perf_counter() - start, sum(len(t) for t in new_tokens)
        stats.prefill_s, stats.draft_s, stats.verify_s = (times.get(k, 0.0) for k in ("prefill", "draft", "verify"))
        return DFlashOutput(sequences, stats if return_stats else None)

    # ---- helpers of `generate` --------------------------------------------------------------------------------

    def _commit(
        self,
        rows: _Rows,
        verify_ids: torch.Tensor,
        accepted: torch.Tensor,
        next_token: torch.Tensor,
        stop_ids: torch.Tensor,
        max_new_tokens: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Commits each row's accepted drafts and the target's token, cut after a stop id or at the budget.

        Returns the candidate tokens (b, w) (drafts up to `accepted`, then the target's token) and how many of
        them each row committed (b,) (0 for rows already done). Updates `rows` in place, on the device.
        """
        j = torch.arange(verify_ids.shape[1], device=verify_ids.device)
        committed = torch.where(j == accepted[:, None], next_token[:, None], verify_ids.roll(-1, dims=1))  # (b, w)
        stops = torch.isin(committed, stop_ids) & (j <= accepted[:, None])
        first_stop = torch.where(stops.any(dim=1), stops.int().argmax(dim=1), verify_ids.shape[1])  # (b,)
        n_new = torch.minimum(torch.minimum(accepted, first_stop) + 1, max_new_tokens - rows.generated)
        n_new = n_new.masked_fill(rows.done, 0)  # (b,)
        rows.tokens.scatter_(1, rows.generated[:, None] + j, committed)  # past n_new: overwritten or cut later
        rows.generated += n_new
        rows.done |= (first_stop < n_new) | (rows.generated >= max_new_tokens)
        rows.anchor, rows.anchor_pos = next_token, rows.anchor_pos + n_new
        return committed, n_new

    def _reach(self, slots: int) -> int | None:
        """How many leading cache slots a step reads: `slots` (past every query position) when eager, so that the
        tail no row has reached is skipped; None (the whole cache) when compiled, whose steps keep one shape."""
        return None if self.compiled else slots

    def _step_costs(self, rows: _Rows, block_size: int, reach: int | None) -> StepCosts:
        """Seconds per step for each candidate verify width: measured once per batch and block size (reading the
        cache up to `reach`, as the first real step does), then kept across calls and corrected by the real steps.

        The measurement writes only slots at and after each row's anchor, which the real steps overwrite before
        reading."""
        b, device = rows.anchor.shape[0], rows.anchor.device
        if (b, block_size) not in self.step_costs:
            positions = rows.anchor_pos[:, None] + torch.arange(block_size, device=device)  # (b, B)
            context = rows.context.new_zeros(b, block_size, rows.context.shape[-1])
            sunk = torch.full_like(positions, self.draft_cache.sink)
            draft, verify = measure_step_costs(
                lambda: self._draft_step(rows.anchor, rows.anchor_pos, context, positions, sunk, block_size, reach),
                lambda w: self._verify_step(
                    rows.anchor[:, None].expand(b, w), positions[:, :w], positions[:, :w], reach=reach
                ),
                candidate_widths(block_size),
                device,
            )
            self.step_costs[b, block_size] = StepCosts(verify, draft)
        return self.step_costs[b, block_size]

    def _allocate(self, batch: int, capacity: int) -> None:
        """Reuses the caches when they fit the request, else allocates both (the only allocation of a call)."""
        device, dtype = self.target.device, self.lm_head.weight.dtype
        if self.target_cache is not None and self.target_cache.fits(batch, capacity, dtype, device):
            for cache in (self.target_cache, self.draft_cache):
                if cache is not None:
                    cache.keep_rows(None)
        else:
            self.target_cache = self.draft_cache = None  # free the old buffers first
            self.target_cache = SlotCache.for_config(self.target.config, batch, capacity, dtype, device)
            if self.drafter is not None:
                draft_dtype = next(self.drafter.parameters()).dtype
                self.draft_cache = SlotCache.for_config(self.drafter.config, batch, capacity, draft_dtype, device)

    @property
    def cache_bytes(self) -> int:
        """Bytes of the current target and drafter caches."""
        return sum(c.nbytes for c in (self.target_cache, self.draft_cache) if c is not None)


def engine_for(target: PreTrainedModel, drafter: nn.Module, compile: bool | dict[str, Any] = False) -> DFlashEngine:
    """The engine of this pair, kept on the drafter (one per `compile` setting) so that its caches, measured step
    costs and compiled steps serve the next call; calls that alternate eager and compiled do not rebuild it."""
    engines = drafter.__dict__.setdefault(_ENGINE_ATTR, {})
    key = repr(compile)
    engine = engines.get(key)
    if engine is None or engine.target is not target:
        engine = engines[key] = DFlashEngine(target, drafter, compile=compile)
    return engine


def dflash_generate(
    target: PreTrainedModel,
    drafter: nn.Module,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_token_ids: list[int] | None = None,
    streamer: BaseStreamer | None = None,
    block_size: int | None = None,
    return_stats: bool = True,
    verify_length: int | str | None = None,
    compile: bool | dict[str, Any] = False,
    generator: torch.Generator | None = None,
    draft: str = "sample",
    lookup: bool = False,
) -> DFlashOutput:
    """DFlash speculative decoding: the target's own output (greedy) or distribution (sampling), faster.

    Args:
        target, drafter: the model and its DFlash drafter (checked with `check_pair`).
        input_ids: (b, P) prompts, left-padded as `attention_mask` (b, P) says (None: no padding).
        max_new_tokens: new tokens per row at most.
        temperature, top_p, top_k: 0 is greedy; otherwise lossless sampling from the target's warped distribution.
        stop_token_ids: ids that end a row (kept in its output); None means the target's eos ids, [] none.
        streamer: a Transformers streamer (batch 1): gets the prompt, then each step's committed tokens.
        block_size: tokens per drafted block (default: the drafter's).
        return_stats: attach [`DFlashStats`] (acceptance, timings, cache bytes).
        verify_length: drafts the target verifies per step: None (all), an int, or "auto" (from the drafter's
            confidence and the measured cost per width).
        compile: `torch.compile` the draft and verify steps.
        generator: RNG for sampling.
        draft: when sampling, "sample" (drafts sampled from the drafter, proper speculative sampling; accepts more
            for a calibrated drafter, see benchmarks/engine.md) or "argmax" (deterministic drafts, accepted while
            the target's own sample matches). Both are lossless.
        lookup: hybrid drafting: per row and step, the drafter's block or the continuation of the longest n-gram of
            the row's context that ends it (prompt lookup), whichever is expected to commit more (`hybrid.py`);
            best with `verify_length="auto"`, which then prices both by the measured cost of each verify width.
            `stats.proposers` says which one each step used. Lossless like the rest.

    Returns:
        [`DFlashOutput`] with `sequences` (b, P + new) and `stats`.
    """
    rule = TokenRule(temperature, top_k, top_p, draft=draft, generator=generator)
    return engine_for(target, drafter, compile).generate(
        input_ids, attention_mask, max_new_tokens, rule, stop_token_ids, streamer, block_size, verify_length,
        return_stats, lookup=lookup,
    )  # fmt: skip
