#!/usr/bin/env bash
# Device step 3 (carry .gpu-carry/quant), started while the machine is still warm after step2.sh: that step left
# transformers 5.24 in /tmp/site and the converted embedded target in /tmp/dcache. Runs `dflash-bench --quantize` on
# the embedded pair in bfloat16 on CUDA for each GPU quantization (full precision vs quantized, side by side: tau,
# tok/s, speed-up over AR of the same target, verify cost in AR steps, identity), then the ParoQuant check.
# Results: $OUT/quant/<method>/comparison.md (+ per-target results.json) and $OUT/quant/log.txt.
set -u
R=$(cd "$(dirname "$0")/../.." && pwd); C=$R/.gpu-carry/quant; OUT=${OUT:-/tmp/out}; Q=/tmp/quant-site
mkdir -p "$OUT/quant" "$Q"
python3 -m pip install -q --no-deps --no-index --target "$Q" "$C"/torchao-*.whl "$C"/paroquant-*.whl \
  || { echo "wheels missing: run benchmarks/gpu/quantized_prepare.sh here and carry .gpu-carry/quant"; exit 4; }
[ -d /tmp/dcache ] || { echo "/tmp/dcache missing (machine not warm): run step1.sh and step2.sh first"; exit 4; }
export PYTHONPATH=/tmp/site:$Q:$R/src DFLASH_CACHE=/tmp/dcache HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cd "$R"
BENCH=(python3 -m transformers_dflash.bench --device cuda --dtype bfloat16 --dataset gsm8k,humaneval
       --gsm8k-path benchmarks/gsm8k_heldout.jsonl --max-samples "${SAMPLES:-2}" --max-new-tokens 128
       --block-sizes 16 --methods ar,dflash --no-progress)
for method in ${METHODS:-int4-weight-only bnb-4bit int8-weight-only}; do
  echo "== $method" | tee -a "$OUT/quant/log.txt"
  timeout "${LIMIT_S:-150}" "${BENCH[@]}" --quantize "$method" --out "$OUT/quant/$method" >> "$OUT/quant/log.txt" 2>&1
  echo "exit $? (2: not installed / not supported, named in the log)" | tee -a "$OUT/quant/log.txt"
  grep "dflash-bench: error" "$OUT/quant/log.txt" | tail -1
  cat "$OUT/quant/$method/comparison.md" 2>/dev/null
done
# ParoQuant: its Transformers backend needs CUDA, AutoAWQ's GEMM kernel and a checkpoint made by its optimizer
# (z-lab/*-PARO on the Hub, for Qwen3 targets: none exists for SmolLM2, and the device has no network).
echo "== paroquant" | tee -a "$OUT/quant/log.txt"
if python3 -c "import paroquant.inference.backends.transformers.quantizer" >> "$OUT/quant/log.txt" 2>&1; then
  echo "paroquant's Transformers backend imports (CUDA rotation kernel built)"
else
  echo "paroquant's Transformers backend does not import here: $(tail -1 "$OUT/quant/log.txt")"
fi
if [ -n "${PARO_TARGET:-}" ] && [ -n "${PARO_DRAFTER:-}" ]; then
  timeout "${LIMIT_S:-150}" "${BENCH[@]/bfloat16/float16}" --target "$PARO_TARGET" --drafter "$PARO_DRAFTER" \
    --full-precision-target "${PARO_FULL:?the full-precision folder of the same model}" --out "$OUT/quant/paroquant" \
    >> "$OUT/quant/log.txt" 2>&1; echo "exit $?"; cat "$OUT/quant/paroquant/comparison.md" 2>/dev/null
else
  echo "no ParoQuant checkpoint given (PARO_TARGET, PARO_DRAFTER, PARO_FULL): skipped"
fi
