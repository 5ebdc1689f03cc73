"""The prepared H200 check of issue 17: greedy identity and tokens/s of every decoding method, in one table.

Two pairs, each method on the same prompts, interleaved (a rotating order per prompt), after one warm-up call per
method (which also compiles; its seconds are reported):

* `embedded`: SmolLM2-135M-Instruct (the embedded target) and the shipped drafter in model_cards/, fp32 (every
  method) and bf16 (the eager methods: identity);
* `qwen3-8b`: a Qwen3-8B-shaped target with random bf16 weights made on the device (nothing downloaded) and a
  5-layer drafter of the z-lab Qwen3-8B-DFlash-b16 shape whose proposals are forced right with probability 0.86
  per position (tau ~6.5, the z-lab figure); its forward pass runs for real, so draft costs are real.

Methods: `hf-ar` (`target.generate`, the reference), `engine-ar` / `engine-ar-compiled` (`ar_generate`),
`dflash` / `dflash-compiled` (`dflash_generate`), `dflash-hybrid` (hybrid drafting: `lookup=True`,
`verify_length="auto"`), `native` (Transformers' DFlash path), `prompt-lookup`. A greedy
output that differs from `hf-ar` is counted, and explained by the target's top-2 logit margin where they part
(a near-tie that bf16 rounding can flip).

    python benchmarks/gpu/run.py --device cuda --out "$OUT/gpu"                                  # on the H200
    python benchmarks/gpu/run.py --device cpu --tiny --compile-backend eager --out /tmp/gpu    # tiny, on a CPU

Writes `table.md` and `results.json` under --out after every section (a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from transformers_dflash import DFlashConfig, DFlashDraftModel
from transformers_dflash.ar import ar_generate
from transformers_dflash.bench_methods import counted_accepts
from transformers_dflash.engine import dflash_generate

ROOT = Path(__file__).resolve().parents[2]
EAGER_METHODS = ["hf-ar", "engine-ar", "dflash", "dflash-hybrid", "native", "prompt-lookup"]
ALL_METHODS = [
    "hf-ar", "engine-ar", "engine-ar-compiled", "dflash", "dflash-compiled", "dflash-hybrid", "native", "prompt-lookup"
]  # fmt: skip
QWEN3_8B = dict(
    vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0, tie_word_embeddings=False,
)  # fmt: skip
TINY_QWEN3 = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, tie_word_embeddings=False,
)  # fmt: skip


class ForcedDrafter(DFlashDraftModel):
    """Proposes `references[row, anchor + k]` with probability `rate` per position (else a wrong token), after its
    real forward pass. Hits are fixed per (row, anchor, k) by a seeded table, so every method meets the same
    proposals. The row is found from the anchor token (read back from its embedding) at the anchor's position.
    All state lives in buffers on the model's device, so the step compiles whole and captures as a CUDA graph."""

    def setup(self, target, references: torch.Tensor, rate: float, seed: int = 0) -> None:
        device = target.device
        g = torch.Generator().manual_seed(seed)
        hits = torch.rand(*references.shape, self.config.block_size, generator=g) < rate  # (n, L, B)
        self.register_buffer("references", references.to(device), persistent=False)
        self.register_buffer("hits", hits.to(device), persistent=False)
        self.register_buffer("head_rows", target.get_output_embeddings().weight.detach(), persistent=False)
        self.register_buffer("embed_rows", target.get_input_embeddings().weight.detach(), persistent=False)

    def forward(self, noise_embeds, context_hidden_states=None, position_ids=None, **kwargs):
        out = super().forward(noise_embeds, context_hidden_states, position_ids, **kwargs)
        b, q, _ = noise_embeds.shape
        last = self.references.shape[1] - 1
        anchor = position_ids[:, -q].expand(b).clamp(max=last)  # (b,)
        token = (noise_embeds[:, 0] @ self.embed_rows.T).argmax(-1)  # (b,) the anchor token
        row = (self.references[:, anchor].T == token[:, None]).int().argmax(-1)  # (b,)
        at = (anchor[:, None] + torch.arange(q, device=anchor.device)).clamp(max=last)  # (b, q)
        good = self.references[row].gather(1, at)
        tokens = torch.where(self.hits[row, anchor, :q], good, (good + 1) % self.head_rows.shape[0])  # (b, q)
        rows = self.head_rows[tokens].float()  # (b, q, H): lm_head(30 * w / |w|^2) puts logit 30 on the token
        out.last_hidden_state = (30.0 * rows / rows.pow(2).sum(-1, keepdim=True)).to(noise_embeds.dtype)
        return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def embedded_pair(args, dtype: torch.dtype):
    """(target, drafter, prompts) of the embedded pair (tiny: a random Qwen3 pair of that kind)."""
    if args.tiny:
        target, drafter = random_pair(args, TINY_QWEN3, dtype, forced=False)
        g = torch.Generator().manual_seed(1)
        return target, drafter, [torch.randint(4, 512, (1, 12), generator=g) for _ in range(args.prompts)]
    from transformers_dflash import zoo

    target, tokenizer = zoo.load_embedded_target(dtype=dtype, device=args.device)
    card = ROOT / "model_cards" / "SmolLM2-135M-Instruct-DFlash-b16"
    drafter = DFlashDraftModel.from_pretrained(card, dtype=dtype).to(args.device).eval()
    lines = (ROOT / "benchmarks" / "gsm8k_heldout.jsonl").read_text().splitlines()[: args.prompts]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": json.loads(line)["question"]}], add_generation_prompt=True,
            return_tensors="pt", return_dict=True,
        )["input_ids"]
        for line in lines
    ]  # fmt: skip
    return target, drafter, prompts


def random_pair(args, shape: dict, dtype: torch.dtype, forced: bool = True):
    """A random Qwen3 target of `shape` made on the device in `dtype`, and a 5-layer (tiny: 1) drafter for it."""
    config = Qwen3Config(**shape, pad_token_id=0, eos_token_id=None, bos_token_id=2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(args.device):
        target = Qwen3ForCausalLM._from_config(config, dtype=dtype).eval()
        if args.tiny:  # sharper logits than the default init, so that greedy paths vary
            with torch.no_grad():
                for p in target.parameters():
                    if p.dim() == 2:
                        p.normal_(0.0, 0.3)
        layers, block = (1, 8) if args.tiny else (5, 16)
        draft_config = DFlashConfig.from_target_config(
            config, mask_token_id=3, num_hidden_layers=layers, block_size=block, num_target_features=5
        )
        draft_config._attn_implementation = "sdpa"
        drafter = (ForcedDrafter if forced else DFlashDraftModel)._from_config(draft_config, dtype=dtype).eval()
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    return target, drafter


def qwen3_8b_pair(args, dtype: torch.dtype):
    target, drafter = random_pair(args, TINY_QWEN3 if args.tiny else QWEN3_8B, dtype)
    g = torch.Generator().manual_seed(2)
    length = 8 if args.tiny else 64
    return (
        target,
        drafter,
        [torch.randint(4, target.config.vocab_size, (1, length), generator=g) for _ in range(args.prompts)],
    )


def method_calls(name: str, target, drafter, new: int, backend: str | None) -> Callable[[torch.Tensor], tuple]:
    """`call(ids) -> (new token ids (list), tokens committed per step or None)` of one method."""
    compile_ = True if backend is None else {"backend": backend}

    def hf(ids, **kwargs):
        with counted_accepts(target) as lengths:
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new, **kwargs
            )
        return out[0, ids.shape[1] :].tolist(), (list(lengths) or None)

    def engine(ids, fn, **kwargs):
        out = fn(ids, max_new_tokens=new, **kwargs)
        return out.sequences[0, ids.shape[1] :].tolist(), out.stats.accept_lengths[0]

    return {
        "hf-ar": lambda ids: hf(ids),
        "engine-ar": lambda ids: engine(ids, lambda i, **k: ar_generate(target, i, **k)),
        "engine-ar-compiled": lambda ids: engine(ids, lambda i, **k: ar_generate(target, i, compile=compile_, **k)),
        "dflash": lambda ids: engine(ids, lambda i, **k: dflash_generate(target, drafter, i, **k)),
        "dflash-compiled": lambda ids: engine(
            ids, lambda i, **k: dflash_generate(target, drafter, i, compile=compile_, **k)
        ),
        "dflash-hybrid": lambda ids: engine(
            ids, lambda i, **k: dflash_generate(target, drafter, i, lookup=True, verify_length="auto", **k)
        ),
        "native": lambda ids: hf(ids, assistant_model=drafter),
        "prompt-lookup": lambda ids: hf(ids, prompt_lookup_num_tokens=10),
    }[name]


def explain(target, ids: torch.Tensor, reference: list[int], output: list[int]) -> dict:
    """Where `output` leaves `reference` (new-token index) and the target's top-2 logit margin there."""
    at = next(
        (i for i, (a, b) in enumerate(zip(reference, output, strict=False)) if a != b),
        min(len(reference), len(output)),
    )
    prefix = torch.cat([ids[0], torch.tensor(reference[:at], dtype=torch.long)])[None].to(target.device)
    with torch.no_grad():
        top = target(prefix).logits[0, -1].float().topk(2).values
    margin, scale = float(top[0] - top[1]), float(top[0].abs())
    return {"position": at, "margin": margin, "top_logit": scale, "near_tie": margin <= max(scale, 1.0) * 2**-6}


def run_section(args, pair: str, dtype: torch.dtype, methods: list[str], deadline: float) -> list[dict]:
    """Every method of `methods` on one pair in one dtype: warm-up, then the prompts, interleaved."""
    maker = embedded_pair if pair == "embedded" else qwen3_8b_pair
    target, drafter, prompts = maker(args, dtype)
    device = target.device
    new = args.new_tokens
    prompts = [p.to(device) for p in prompts]
    references = [method_calls("hf-ar", target, drafter, new, None)(p)[0] for p in prompts]
    if isinstance(drafter, ForcedDrafter):
        width = max(p.shape[1] for p in prompts) + new + 1
        table = torch.zeros(len(prompts), width, dtype=torch.long)
        for r, (p, ref) in enumerate(zip(prompts, references, strict=True)):
            row = p[0].tolist() + ref
            table[r, : len(row)] = torch.tensor(row)
        drafter.setup(target, table, rate=args.rate)
    rows = {
        m: {"method": m, "seconds": [], "tokens": 0, "lengths": [], "identical": 0, "mismatches": []} for m in methods
    }
    calls = {m: method_calls(m, target, drafter, new, args.compile_backend) for m in methods}
    for m in methods:
        if time.perf_counter() > deadline:
            rows[m]["skipped"] = "time budget"
            continue
        sync(device)
        start = time.perf_counter()
        calls[m](prompts[0])  # warm-up (compiles)
        sync(device)
        rows[m]["warmup_s"] = time.perf_counter() - start
    live = [m for m in methods if "skipped" not in rows[m]]
    for i, (ids, reference) in enumerate(zip(prompts, references, strict=True)):
        for m in live[i % len(live) :] + live[: i % len(live)]:
            sync(device)
            start = time.perf_counter()
            output, lengths = calls[m](ids)
            sync(device)
            row = rows[m]
            row["seconds"].append(time.perf_counter() - start)
            row["tokens"] += len(output)
            row["lengths"] += lengths or []
            if output == reference:
                row["identical"] += 1
            else:
                row["mismatches"].append(explain(target, ids, reference, output))
    out = []
    for m in methods:
        row = rows[m]
        row.update(pair=pair, dtype=str(dtype).removeprefix("torch."), prompts=len(prompts))
        if row["seconds"]:
            row["tok_s"] = row["tokens"] / sum(row["seconds"])
            row["tau"] = statistics.mean(row["lengths"]) if row["lengths"] else None
        row.pop("lengths")
        out.append(row)
    del target, drafter
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def format_table(rows: list[dict]) -> str:
    """One markdown table; speed-ups against `hf-ar` and against the best engine AR of the same pair and dtype."""
    lines = [
        "| pair | dtype | method | tok/s | vs HF AR | vs best engine AR | tau | identical to HF AR | warm-up s |",
        "|---|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        group = [r for r in rows if (r["pair"], r["dtype"]) == (row["pair"], row["dtype"]) and "tok_s" in r]
        hf = next((r["tok_s"] for r in group if r["method"] == "hf-ar"), math.nan)
        ar = max((r["tok_s"] for r in group if r["method"].startswith("engine-ar")), default=math.nan)
        if "tok_s" not in row:
            lines.append(
                f"| {row['pair']} | {row['dtype']} | {row['method']} | skipped ({row.get('skipped')}) | | | | | |"
            )
            continue
        tau = f"{row['tau']:.2f}" if row["tau"] else "-"
        same = f"{row['identical']}/{row['prompts']}"
        if row["mismatches"]:
            ties = sum(m["near_tie"] for m in row["mismatches"])
            same += f" ({ties} of {len(row['mismatches'])} mismatches at a near-tie)"
        lines.append(
            f"| {row['pair']} | {row['dtype']} | {row['method']} | {row['tok_s']:.1f} | {row['tok_s'] / hf:.2f}x | "
            f"{row['tok_s'] / ar:.2f}x | {tau} | {same} | {row['warmup_s']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny random shapes (a test on a CPU)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=None, help="prompts per section (default 6; tiny 2)")
    parser.add_argument("--new-tokens", type=int, default=None, help="new tokens per prompt (default 128; tiny 12)")
    parser.add_argument("--rate", type=float, default=0.86, help="forced drafter: hit rate per position (tau ~6.5)")
    parser.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="methods not warmed up by then are skipped")
    parser.add_argument("--sections", default="embedded:float32,qwen3-8b:bfloat16,embedded:bfloat16")
    args = parser.parse_args(argv)
    args.prompts = args.prompts or (2 if args.tiny else 6)
    args.new_tokens = args.new_tokens or (12 if args.tiny else 128)
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + args.budget_s
    rows: list[dict] = []
    for section in args.sections.split(","):
        pair, dtype_name = section.split(":")
        methods = EAGER_METHODS if (pair, dtype_name) == ("embedded", "bfloat16") else ALL_METHODS
        print(f"== {pair} {dtype_name} ({time.perf_counter() - deadline + args.budget_s:.0f} s)", flush=True)
        rows += run_section(args, pair, getattr(torch, dtype_name), methods, deadline)
        table = format_table(rows)
        (args.out / "table.md").write_text(table + "\n")
        (args.out / "results.json").write_text(
            json.dumps({"device": device_name(args.device), "rows": rows}, indent=1)
        )
        print(table, flush=True)
    return table


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device.startswith("cuda") else f"cpu, torch {torch.__version__}"


if __name__ == "__main__":
    main()
