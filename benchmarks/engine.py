"""Engine benchmark on this CPU: AR greedy vs Transformers' native DFlash path vs the fast engine.

A tiny-but-not-trivial random Qwen3 target (hidden 256, 8 layers, vocab 2048) and a 2-layer DFlash drafter whose
output is forced: at each block position it proposes the target's own greedy token with probability `rate`
(independently per position, so accepted lengths are geometric), with a calibrated confidence. The drafter still
runs its real forward pass, so draft costs are real. All methods produce the same tokens (greedy, lossless).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/engine.py [--runs 5] [--new-tokens 128] [--threads 1]

Prints markdown tables (see benchmarks/engine.md): tokens/s (medians, interleaved runs), tau, ideal speed-up
tau * t_AR / (t_verify + t_draft) and efficiency; batch scaling; fixed vs adaptive verify length; and the expected
acceptance of the two lossless sampling rules for a calibrated drafter.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from transformers_dflash import DFlashConfig, DFlashDraftModel
from transformers_dflash.engine import dflash_generate

VOCAB, HIDDEN, LAYERS, BLOCK, PROMPT = 2048, 256, 8, 16, 32


class BernoulliDrafter(DFlashDraftModel):
    """Proposes `references[row, anchor + k]` with probability `rate` per position, else a wrong token.

    Whether position k of the block anchored at position a is right is fixed per (row, a, k) by a seeded table,
    so every method that reaches the same anchors sees the same proposals: same tau, a like-for-like comparison.
    The engine drops finished rows from its batch, so a row is recognised by its anchor (position, token), the
    token being read back from its embedding.
    Its logits put `confidence = rate` on the proposed token (a calibrated drafter), which the adaptive verify
    length reads; `calls` counts forward passes (= decoding steps on either path).
    """

    def setup(self, target, references: torch.Tensor, rate: float, seed: int = 0) -> None:
        self.lm_head_rows = target.get_output_embeddings().weight.detach()
        self.embed_rows = target.get_input_embeddings().weight.detach()
        self.references, self.rate, self.calls = references, rate, 0
        g = torch.Generator().manual_seed(seed)
        self.hits = torch.rand(references.shape[0], references.shape[1], BLOCK, generator=g) < rate  # (b, L, B)
        logit = math.log((VOCAB - 1) * rate / (1 - rate)) if rate < 1 else 12.0  # softmax(token) = rate
        self.logit = torch.tensor(logit)  # a tensor, not a float: `torch.compile` would recompile per rate

    def forward(self, noise_embeds, context_hidden_states=None, position_ids=None, **kwargs):
        out = super().forward(noise_embeds, context_hidden_states, position_ids, **kwargs)
        if not torch.compiler.is_compiling():  # (a counter inside a compiled graph would force recompiles)
            self.calls += 1
        b, q, _ = noise_embeds.shape
        anchor = position_ids[:, -q].expand(b).clamp(max=self.references.shape[1] - 1)  # (b,)
        token = (noise_embeds[:, 0] @ self.embed_rows.T).argmax(-1)  # (b,) the anchor token
        row = (self.references[:, anchor].T == token[:, None]).int().argmax(-1)  # (b,) its reference row
        at = (anchor[:, None] + torch.arange(q)).clamp(max=self.references.shape[1] - 1)  # (b, q)
        good = self.references[row].gather(1, at)
        hit = self.hits[row, anchor, :q]  # (b, q)
        tokens = torch.where(hit, good, (good + 1) % VOCAB)  # (b, q)
        rows = self.lm_head_rows[tokens]  # (b, q, H): lm_head(c * w / |w|^2) puts logit c on the token
        out.last_hidden_state = self.logit * rows / rows.pow(2).sum(-1, keepdim=True)
        return out


def make_pair(seed: int = 0) -> tuple[Qwen3ForCausalLM, BernoulliDrafter]:
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=HIDDEN // 4, max_position_embeddings=2048,
        pad_token_id=0, eos_token_id=None, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    target = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in target.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    target.generation_config.eos_token_id = None
    draft_config = DFlashConfig.from_target_config(config, mask_token_id=3, num_hidden_layers=2, block_size=BLOCK)
    return target, BernoulliDrafter(draft_config).eval()


def prompts(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, P) left-padded prompts of ragged lengths around PROMPT (batch 1: exactly PROMPT)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [PROMPT] if batch == 1 else [PROMPT - 8 + (i * 5) % 17 for i in range(batch)]
    width = max(lengths)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(4, VOCAB, (n,), generator=g)
        mask[row, width - n :] = 1
    return ids, mask


def references(target, ids, mask, new_tokens: int) -> torch.Tensor:
    """(b, L) each row's unpadded greedy sequence (prompt + generation), right-padded: what the drafter proposes."""
    rows = []
    for row in range(ids.shape[0]):
        prompt = ids[row, mask[row].bool()][None]
        rows.append(target.generate(prompt, do_sample=False, max_new_tokens=new_tokens + BLOCK)[0])
    out = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
    for row, r in enumerate(rows):
        out[row, : len(r)] = r
    return out


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def compare_methods(target, drafter, rates: list[float], runs: int, new_tokens: int) -> list[str]:
    ids, mask = prompts(1)
    refs = references(target, ids, mask, new_tokens)
    lines = [
        "| rate | AR tok/s | native tok/s | engine tok/s | engine / native | engine compile=True tok/s | "
        "compiled / native | tau native | tau engine | ideal x | measured x | efficiency |",
        "|---" * 12 + "|",
    ]
    for rate in rates:
        drafter.setup(target, refs, rate)
        methods = {
            "ar": lambda: target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens),
            "native": lambda: target.generate(
                ids, attention_mask=mask, assistant_model=drafter, do_sample=False, max_new_tokens=new_tokens
            ),
            "engine": lambda: dflash_generate(
                target, drafter, ids, mask, max_new_tokens=new_tokens, stop_token_ids=[]
            ),
            "compiled": lambda: dflash_generate(
                target, drafter, ids, mask, max_new_tokens=new_tokens, stop_token_ids=[], compile=True
            ),
        }
        times = {name: [] for name in methods}
        taus, step_costs = {"native": [], "engine": []}, []
        for run in range(runs + 1):  # run 0 warms up
            order = list(methods)[run % 4 :] + list(methods)[: run % 4]  # interleaved, rotating order
            for name in order:
                drafter.calls = 0
                seconds, result = timed(methods[name])
                if run == 0:
                    continue
                times[name].append(seconds)
                if name == "native":
                    assert torch.equal(result, refs[:, : ids.shape[1] + new_tokens])
                    taus["native"].append((new_tokens - 1) / drafter.calls)
                if name == "compiled":
                    assert torch.equal(result.sequences, refs[:, : ids.shape[1] + new_tokens])
                if name == "engine":
                    assert torch.equal(result.sequences, refs[:, : ids.shape[1] + new_tokens])
                    taus["engine"].append(result.stats.tau)
                    step_costs.append((result.stats.draft_s + result.stats.verify_s) / result.stats.steps)
        speed = {name: new_tokens / statistics.median(t) for name, t in times.items()}
        tau = {name: statistics.median(t) for name, t in taus.items()}
        t_ar_step = statistics.median(times["ar"]) / new_tokens
        ideal = tau["engine"] * t_ar_step / statistics.median(step_costs)
        measured = speed["engine"] / speed["ar"]
        lines.append(
            f"| {rate} | {speed['ar']:.1f} | {speed['native']:.1f} | {speed['engine']:.1f} | "
            f"{speed['engine'] / speed['native']:.2f} | {speed['compiled']:.1f} | "
            f"{speed['compiled'] / speed['native']:.2f} | {tau['native']:.2f} | {tau['engine']:.2f} | {ideal:.2f} | "
            f"{measured:.2f} | {measured / ideal:.2f} |"
        )
        print(lines[-1], flush=True)
    return lines


def batch_scaling(target, drafter, rate: float, runs: int, new_tokens: int) -> list[str]:
    """Aggregate tokens/s serving the same 8 ragged prompts one at a time (batch 1) and together (batch 8).

    Whole-block and adaptive verify, and AR. Both batch sizes do the same work at the same acceptance: the drafter's
    hit table is per (prompt, anchor), so each prompt accepts alike alone or in the batch. Every configuration runs
    once per round, so that load changes on a shared machine hit them alike."""
    ids, mask = prompts(8, seed=1)
    refs = references(target, ids, mask, new_tokens)
    alone = [(ids[row, mask[row].bool()][None], None) for row in range(ids.shape[0])]  # unpadded, one per call
    drafter.setup(target, refs, rate)
    work = {1: alone, 8: [(ids, mask)]}
    configs = [(batch, verify) for batch in work for verify in (None, "auto", "ar")]
    times, taus = {c: [] for c in configs}, {c: [] for c in configs}
    for run in range(runs + 1):  # run 0 warms up (and measures the adaptive costs)
        for batch, verify in configs:
            seconds, accepted, steps = 0.0, 0, 0
            for i, m in work[batch]:
                if verify == "ar":
                    call = lambda i=i, m=m: target.generate(  # noqa: E731
                        i, attention_mask=m, do_sample=False, max_new_tokens=new_tokens
                    )
                else:
                    call = lambda i=i, m=m, v=verify: dflash_generate(  # noqa: E731
                        target, drafter, i, m, max_new_tokens=new_tokens, stop_token_ids=[], verify_length=v
                    )
                elapsed, out = timed(call)
                seconds += elapsed
                if verify != "ar":
                    accepted += sum(map(sum, out.stats.accept_lengths))
                    steps += sum(map(len, out.stats.accept_lengths))
            if verify != "ar":
                taus[batch, verify].append(accepted / steps)
            if run:
                times[batch, verify].append(seconds)
    lines = [
        "| method | batch 1 tok/s (8 prompts in turn) | batch 8 aggregate tok/s | batch 8 / batch 1 | tau b1 | tau b8 |",
        "|---" * 6 + "|",
    ]
    for verify, name in ((None, "engine, whole block"), ("auto", "engine, verify auto"), ("ar", "AR generate")):
        speed = {batch: 8 * new_tokens / statistics.median(times[batch, verify]) for batch in work}
        tau = {
            batch: f"{statistics.median(taus[batch, verify]):.2f}" if taus[batch, verify] else "1" for batch in work
        }
        lines.append(f"| {name} | {speed[1]:.1f} | {speed[8]:.1f} | {speed[8] / speed[1]:.2f} | {tau[1]} | {tau[8]} |")
        print(lines[-1], flush=True)
    return lines


def verify_lengths(target, drafter, rates: list[float], runs: int, new_tokens: int) -> list[str]:
    ids, mask = prompts(1)
    refs = references(target, ids, mask, new_tokens)
    settings = [1, 3, 7, None, "auto"]
    names = ["1", "3", "7", "15 (block)", "auto"]
    lines = ["| rate | " + " | ".join(f"verify {n} tok/s" for n in names) + " | auto widths |", "|---" * 7 + "|"]
    for rate in rates:
        drafter.setup(target, refs, rate)
        times = {i: [] for i in range(len(settings))}
        widths = []
        for run in range(runs + 1):
            for i, setting in enumerate(settings):
                seconds, out = timed(
                    lambda s=setting: dflash_generate(
                        target, drafter, ids, mask, max_new_tokens=new_tokens, stop_token_ids=[], verify_length=s
                    )
                )
                if run:
                    times[i].append(seconds)
                    if setting == "auto":
                        widths = out.stats.verify_widths
        cells = [f"{new_tokens / statistics.median(times[i]):.1f}" for i in range(len(settings))]
        common = ", ".join(f"{w}: {widths.count(w)}" for w in sorted(set(widths)))
        lines.append(f"| {rate} | " + " | ".join(cells) + f" | {common} |")
        print(lines[-1], flush=True)
    return lines


def sampling_rules(target, contexts: int = 64) -> list[str]:
    """Expected accepted drafts among the first two positions for a calibrated DFlash-like drafter at temperature 1.

    Position 1: q1 = p1 exactly. Position 2: q2 is the marginal sum_x p1(x) p2(. | x) (the drafter does not know
    which token fills position 1), while the target judges it with p2(. | actual x1).
    * sampled drafts + speculative sampling: a1 = sum min(p1, q1) = 1, a2 = E_{x1 ~ p1} sum min(p2(.|x1), q2);
    * argmax drafts + match-the-target-sample: a1 = p1(argmax q1), a2 = p2(argmax q2 | argmax q1).
    Also with a noisier drafter, q = softmax(log p + N(0, sigma^2)).
    """
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, VOCAB, (contexts, PROMPT), generator=g)
    top = 64  # p2 is evaluated for the 64 most likely first tokens (they hold almost all of p1's mass)
    with torch.no_grad():
        p1 = target(ids).logits[:, -1].float().softmax(-1)  # (c, V)
        first = p1.topk(top, dim=-1).indices  # (c, top)
        extended = torch.cat([ids.repeat_interleave(top, 0), first.reshape(-1, 1)], 1)
        p2 = torch.cat([target(chunk).logits[:, -1].float().softmax(-1) for chunk in extended.split(256)])
    p2 = p2.view(contexts, top, VOCAB)
    w1 = p1.gather(1, first)
    w1 = w1 / w1.sum(1, keepdim=True)  # (c, top)

    def noisy(p: torch.Tensor, sigma: float) -> torch.Tensor:
        return (p.log() + sigma * torch.randn(p.shape, generator=g)).softmax(-1)

    lines = ["| drafter noise sigma | rule | a1 | a2 | expected accepted of 2 |", "|---|---|---|---|---|"]
    for sigma in (0.0, 0.5, 1.0):
        q1, q2 = noisy(p1, sigma), noisy((w1[..., None] * p2).sum(1), sigma)  # (c, V); q2: position 2's marginal
        a1 = torch.minimum(p1, q1).sum(-1)
        a2 = (w1 * torch.minimum(p2, q2[:, None]).sum(-1)).sum(-1)
        sample = (a1.mean(), a2.mean(), (a1 + a1 * a2).mean())
        d1, d2 = q1.argmax(-1), q2.argmax(-1)
        with torch.no_grad():
            p2_d1 = target(torch.cat([ids, d1[:, None]], 1)).logits[:, -1].float().softmax(-1)  # p2(. | x1 = d1)
        b1, b2 = p1.gather(1, d1[:, None])[:, 0], p2_d1.gather(1, d2[:, None])[:, 0]
        argmax = (b1.mean(), b2.mean(), (b1 + b1 * b2).mean())
        for name, (x, y, z) in (("sampled drafts + speculative sampling", sample), ("argmax drafts + match", argmax)):
            lines.append(f"| {sigma} | {name} | {x:.3f} | {y:.3f} | {z:.3f} |")
    print("\n".join(lines), flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--sections", default="methods,batch,verify,sampling", help="comma list of the tables to measure"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, drafter = make_pair()
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.runs} runs, {args.new_tokens} new tokens")
    tables = {
        "methods": ("Methods (batch 1, greedy, block 16)", lambda: compare_methods(target, drafter, [0.5, 0.8, 0.95], args.runs, args.new_tokens)),
        "batch": ("Batch scaling (rate 0.8)", lambda: batch_scaling(target, drafter, 0.8, args.runs, args.new_tokens)),
        "verify": ("Verify length (batch 1)", lambda: verify_lengths(target, drafter, [0.3, 0.8], args.runs, args.new_tokens)),
        "sampling": ("Sampling rules (temperature 1, analytic)", lambda: sampling_rules(target)),
    }  # fmt: skip
    sections = [(tables[name][0], tables[name][1]()) for name in args.sections.split(",")]
    print()
    for title, lines in sections:
        print(f"### {title}\n")
        print("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
