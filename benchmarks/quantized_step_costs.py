"""Per-step cost of the embedded target in fp32 and quantized (torchao int8) on this CPU: one AR step (1 token on a
KV cache) and one verify forward (16 tokens on the same cache), medians of interleaved rounds.

    PYTHONPATH=src python benchmarks/quantized_step_costs.py --rounds 20 --threads 2

It answers the two questions of "Quantized targets" in the README without a whole decode: does int8 make an AR step
cheaper, and does it make a 16-token verify cheaper relative to an AR step (the CPU break-even tau)?
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from transformers_dflash.bench import load_target
from transformers_dflash.compat import cache_kwarg


def _step_seconds(model, prefix: torch.Tensor, width: int) -> float:
    """Seconds of one forward of `width` tokens on a fresh cache of `prefix`."""
    cache = DynamicCache(config=model.config)
    kwarg = cache_kwarg(model.forward)  # `cache` or `past_key_values`, by Transformers version
    model(prefix, **{kwarg: cache}, use_cache=True)
    block = prefix[:, -width:]
    start = time.perf_counter()
    model(block, **{kwarg: cache}, use_cache=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="none,int8-weight-only,int8-dynamic")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefix", type=int, default=128, help="tokens already in the cache")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = args.methods.split(",")
    models = {n: load_target(None, torch.float32, torch.device("cpu"), None if n == "none" else n)[0] for n in names}
    prefix = torch.randint(100, 20000, (1, args.prefix), generator=torch.Generator().manual_seed(0))
    times: dict[tuple[str, int], list[float]] = {(n, w): [] for n in names for w in (1, 16)}
    with torch.inference_mode():
        for n in names:  # warm-up
            _step_seconds(models[n], prefix, 16)
        for r in range(args.rounds):
            for n in names[r % len(names) :] + names[: r % len(names)]:
                for w in (1, 16):
                    times[n, w].append(_step_seconds(models[n], prefix, w))
    ar = statistics.median(times["none", 1]) if "none" in names else None
    print(f"threads {args.threads}, prefix {args.prefix}, {args.rounds} interleaved rounds, medians")
    print("| target | AR step ms | 16-token verify ms | verify in AR steps | AR step vs fp32 |")
    print("|---|---:|---:|---:|---:|")
    for n in names:
        one, sixteen = statistics.median(times[n, 1]), statistics.median(times[n, 16])
        vs = f"{one / ar:.2f}x" if ar else "-"
        print(
            f"| {'fp32' if n == 'none' else n} | {1000 * one:.1f} | {1000 * sixteen:.1f} | {sixteen / one:.2f} | {vs} |"
        )


if __name__ == "__main__":
    main()
