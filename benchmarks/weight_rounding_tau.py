"""Acceptance on a target whose weights are rounded to 4 or 8 bits: what a quantized target does to tau.

No 4-bit kernel runs on this CPU (torchao's int4 layouts and bitsandbytes NF4 are CUDA paths), but the acceptance
question does not need one: it depends on the rounded weights, not on the kernel. This script rounds the embedded
target's decoder linear weights (not the embedding or the LM head, which Transformers' quantizers keep in full
precision by default) the way weight-only quantizers do, and computes in fp32:

* int8: symmetric, one scale per output channel (torchao's int8 weight-only);
* int4: asymmetric, a scale and a zero point per group of `--group` input channels (the int4 weight-only / AWQ /
  GPTQ storage format; group 64 because SmolLM2's hidden size 576 is not a multiple of 128).

Then the shipped drafter decodes each held-out prompt (greedy, block 16, the engine at batch 1) on the fp32 target and
on each rounded copy, interleaved per prompt; tau per copy and its share of the fp32 tau, and whether each output is
identical to its own copy's greedy AR (`generate`). Speed is not measured: fake quantization computes in fp32.

    python benchmarks/weight_rounding_tau.py --max-samples 2 --max-new-tokens 64    # ~5 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import copy
import json
from collections import defaultdict

import torch
from torch import nn
from tqdm.auto import tqdm

from transformers_dflash import DFlashDraftModel
from transformers_dflash.prompts import load_prompts
from transformers_dflash.training.data import chat_text
from transformers_dflash.training.evaluate import measure_tau
from transformers_dflash.zoo import embedded_drafter_dir, load_embedded_target


def round_int8(weight: torch.Tensor) -> torch.Tensor:
    """(out, in) weight rounded to symmetric int8 with one scale per output channel, back in its dtype."""
    scale = weight.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127  # (out, 1)
    return (weight / scale).round().clamp(-128, 127) * scale


def round_int4(weight: torch.Tensor, group: int) -> torch.Tensor:
    """(out, in) weight rounded to asymmetric 4 bits (0..15) with a scale and zero point per `group` inputs."""
    out_features, in_features = weight.shape
    if in_features % group:
        raise ValueError(f"--group {group} does not divide the input size {in_features}; try 64 or 32.")
    grouped = weight.reshape(out_features, in_features // group, group)  # (out, groups, group)
    low, high = grouped.amin(dim=-1, keepdim=True), grouped.amax(dim=-1, keepdim=True)
    scale = (high - low).clamp_min(1e-12) / 15
    q = ((grouped - low) / scale).round().clamp(0, 15)
    return (q * scale + low).reshape(out_features, in_features)


def rounded_copy(target: nn.Module, bits: int, group: int) -> nn.Module:
    """A copy of `target` whose decoder `nn.Linear` weights are rounded to `bits` (embedding and LM head kept)."""
    copied = copy.deepcopy(target)
    with torch.no_grad():
        for module in copied.model.layers.modules():
            if isinstance(module, nn.Linear):
                w = module.weight
                w.copy_(round_int8(w) if bits == 8 else round_int4(w, group))
    return copied


def main() -> None:
    """Prints a JSON summary and a markdown table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gsm8k-path", default="benchmarks/gsm8k_heldout.jsonl")
    p.add_argument("--max-samples", type=int, default=2, help="prompts per set (first turns)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--group", type=int, default=64, help="int4 group size (input channels per scale)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_embedded_target(dtype=torch.float32, device="cpu")
    drafter = DFlashDraftModel.from_pretrained(embedded_drafter_dir(), dtype=torch.float32).eval()
    targets = {
        "fp32": target,
        "int8": rounded_copy(target, 8, args.group),
        "int4": rounded_copy(target, 4, args.group),
    }
    eos = [target.generation_config.eos_token_id]
    prompts = [
        (name, prompt)
        for name in ("gsm8k", "humaneval", "mt-bench")
        for prompt in load_prompts(name, args.max_samples, path=args.gsm8k_path if name == "gsm8k" else None)
    ]
    committed, steps = defaultdict(float), defaultdict(int)  # (copy, set) -> tokens committed, verify steps
    identical, parted = defaultdict(int), defaultdict(int)  # copy -> outputs equal to its own AR; to fp32's AR
    for name, prompt in tqdm(prompts, desc="prompts"):
        ids = tokenizer(chat_text(tokenizer, prompt), add_special_tokens=False).input_ids
        reference = None
        for label, model in targets.items():
            with torch.no_grad():
                ar = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=args.max_new_tokens)
            ar = ar[0, len(ids) :].tolist()
            reference = ar if reference is None else reference
            result = measure_tau(model, drafter, [ids], args.max_new_tokens, eos)
            for key in (name, "all"):
                committed[label, key] += result.tau * result.steps
                steps[label, key] += result.steps
            identical[label] += result.outputs[0] == ar
            parted[label] += ar != reference
    sets = ["gsm8k", "humaneval", "mt-bench", "all"]
    tau = {label: {s: committed[label, s] / steps[label, s] for s in sets} for label in targets}
    print(json.dumps({"tau": tau, "identical_to_own_ar": dict(identical), "ar_differs_from_fp32": dict(parted)}))
    print("\n| target | " + " | ".join(f"tau {s}" for s in sets) + " | share of fp32 tau (all) | DFlash == own AR |")
    print("|---|" + "---:|" * len(sets) + "---:|---|")
    for label in targets:
        cells = " | ".join(f"{tau[label][s]:.2f}" for s in sets)
        share = tau[label]["all"] / tau["fp32"]["all"]
        print(f"| {label} | {cells} | {share:.0%} | {identical[label]}/{len(prompts)} |")


if __name__ == "__main__":
    main()
