#!/usr/bin/env bash
# On the CPU host, before the two device runs: builds .gpu-carry/run1 and .gpu-carry/run2 (git-ignored), each
# sized so that the tracked tree plus it fits one run's 64 MiB. Run 1 carries transformers 5.24 + gguf (the
# H200 image has 5.17) and the first part of the embedded target's GGUF (xz); run 2 carries the rest.
set -eu
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/work/main/.venv/bin/python}
C=.gpu-carry; rm -rf "$C"; mkdir -p "$C/run1" "$C/run2"
SITE=$("$PY" -c 'import os, transformers; print(os.path.dirname(os.path.dirname(transformers.__file__)))')
(cd "$SITE" && tar --exclude=__pycache__ -cf - transformers transformers-*.dist-info gguf gguf-*.dist-info) \
  | xz -9 -T0 > "$C/run1/site.tar.xz"
GGUF=$(PYTHONPATH=src "$PY" -c 'from transformers_dflash.zoo import _gguf_source; print(_gguf_source())')
xz -6 -T0 -c "$GGUF" > "$C/g.xz"
sha256sum "$GGUF" | cut -c1-16 > "$C/run2/gguf.sha"
LIMIT=$((64 * 1024 * 1024 - 256 * 1024))
TREE=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r stat -c %s | awk '{s+=$1} END {print s+0}')
A=$((LIMIT - TREE - $(stat -c %s "$C/run1/site.tar.xz")))
head -c "$A" "$C/g.xz" > "$C/run1/g.xz.a"
tail -c +"$((A + 1))" "$C/g.xz" > "$C/run2/g.xz.b"
rm "$C/g.xz"
B=$(stat -c %s "$C/run2/g.xz.b")
[ $((TREE + B + 4096)) -le "$LIMIT" ] || { echo "run 2 would carry $((TREE + B)) bytes > $LIMIT: shrink the tree"; exit 1; }
du -b "$C"/run1/* "$C"/run2/*; echo "tree $TREE bytes; both runs fit"
