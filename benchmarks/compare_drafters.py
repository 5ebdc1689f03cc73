"""Held-out tau of several drafters for the embedded target on the same prompts, interleaved per prompt.

Greedy, fp32; each prompt is decoded by every drafter in turn (so machine noise cannot favour one), and tau is
reported per prompt source and overall, with each drafter's tokens/s (`measure_tau`: the engine at batch 1, eager)
and a check that every drafter produced the same output (they must: the target decides). This is how the
stages of the embedded drafter were compared (README, "Embedded default"):

    python benchmarks/compare_drafters.py runs/embedded/prompts.eval.jsonl --max-new-tokens 96 \
        stage2=/tmp/stage2-drafter stage3=model_cards/SmolLM2-135M-Instruct-DFlash-b16
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
from tqdm.auto import tqdm

from transformers_dflash import DFlashDraftModel
from transformers_dflash.prompts import load_prompts
from transformers_dflash.training.data import chat_text
from transformers_dflash.training.evaluate import measure_tau
from transformers_dflash.zoo import load_embedded_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompts", help="prompt JSONL (e.g. a run's prompts.eval.jsonl)")
    parser.add_argument("drafters", nargs="+", metavar="NAME=DIR", help="drafter folders (exported or checkpoints)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="tokens per prompt (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_embedded_target()
    drafters = {}
    for spec in args.drafters:
        name, _, folder = spec.partition("=")
        drafters[name] = DFlashDraftModel.from_pretrained(folder, dtype=torch.float32).eval()
    eos = [target.generation_config.eos_token_id]
    committed = defaultdict(float)  # (drafter, source) -> tokens committed over all verify steps
    steps = defaultdict(int)  # (drafter, source) -> verify steps
    seconds, tokens = defaultdict(float), defaultdict(int)  # drafter -> decoding wall time, new tokens
    identical = 0
    prompts = load_prompts(f"jsonl:{args.prompts}")
    for prompt in tqdm(prompts, desc="prompts"):
        ids = tokenizer(chat_text(tokenizer, prompt), add_special_tokens=False).input_ids
        outputs = set()
        for name, drafter in drafters.items():
            result = measure_tau(target, drafter, [ids], args.max_new_tokens, eos)
            for source in (prompt.dataset, "all"):
                committed[name, source] += result.tau * result.steps
                steps[name, source] += result.steps
            outputs.add(tuple(result.outputs[0]))
            seconds[name] += result.seconds
            tokens[name] += result.new_tokens
        identical += len(outputs) == 1
    table: dict[str, dict[str, float]] = {name: {} for name in drafters}
    for (name, source), count in steps.items():
        table[name][source] = round(committed[name, source] / count, 3)
    speed = {name: round(tokens[name] / seconds[name], 2) for name in drafters}
    print(
        json.dumps(
            {"tau": table, "tokens_per_second": speed, "identical_outputs": f"{identical}/{len(prompts)}"}, indent=1
        )
    )


if __name__ == "__main__":
    main()
