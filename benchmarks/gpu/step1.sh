#!/usr/bin/env bash
# Device run 1 (carry .gpu-carry/run1): transformers 5.24 + gguf into /tmp/site, GGUF part a into /tmp/keep.
set -eu
R=$(cd "$(dirname "$0")/../.." && pwd); C=$R/.gpu-carry/run1
mkdir -p /tmp/site /tmp/keep
unxz() { if command -v xz >/dev/null; then xz -dc; else python3 -c 'import lzma,sys;sys.stdout.buffer.write(lzma.decompress(sys.stdin.buffer.read()))'; fi; }
unxz < "$C/site.tar.xz" | tar -C /tmp/site -xf -
cp "$C/g.xz.a" /tmp/keep/
PYTHONPATH=/tmp/site:$R/src python3 -c "
import torch, transformers, gguf, transformers_dflash
print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
ls -la /tmp/keep
