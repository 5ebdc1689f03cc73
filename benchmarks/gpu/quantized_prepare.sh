#!/usr/bin/env bash
# On the CPU host, before the device run of quantized.sh: puts the torchao and paroquant wheels (3.5 MB, no
# dependencies; the H200 has no network) into .gpu-carry/quant (git-ignored), to carry with the run.
set -eu
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/work/main/.venv/bin/python}
C=.gpu-carry/quant; rm -rf "$C"; mkdir -p "$C"
"$PY" -m pip download -q --no-deps torchao==0.18.0 paroquant==0.1.16 -d "$C"
du -b "$C"/*
