"""Checkpoint export: the remote-code files that make a saved drafter load anywhere.

`save_pretrained` writes `config.json` (z-lab dialect) and `model.safetensors`; this module adds `dflash.py`
(the `auto_map` entry point) and the package modules it needs, copied byte for byte from this package at save
time: the model code has one source of truth and the shipped files are never a hand-kept copy.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch
from transformers import PretrainedConfig, PreTrainedModel

PACKAGE_DIR = Path(__file__).resolve().parent
ENTRY_MODULES = ("configuration_dflash", "modeling_dflash")
_RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.(\w+)\s+import", flags=re.MULTILINE)
_ENTRY_POINT = '''"""DFlash drafter, remote-code entry point (written by transformers-dflash; regenerate, do not edit).

`AutoModel.from_pretrained(<this folder>, trust_remote_code=True)` loads `DFlashDraftModel` from here.
"""

from .configuration_dflash import DFlashConfig
from .modeling_dflash import DFlashDraftModel

__all__ = ["DFlashConfig", "DFlashDraftModel"]
'''


def remote_code_modules() -> list[str]:
    """Package modules the drafter's code imports, transitively (what a remote-code folder must contain)."""
    seen: list[str] = []
    todo = list(ENTRY_MODULES)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        source = (PACKAGE_DIR / f"{name}.py").read_text()
        todo.extend(m for m in _RELATIVE_IMPORT.findall(source) if m not in seen)
    return sorted(seen)


def write_remote_code(save_directory: str | Path) -> Path:
    """Writes `dflash.py` and the modules it needs beside `config.json`; returns the path of `dflash.py`."""
    out = Path(save_directory)
    out.mkdir(parents=True, exist_ok=True)
    for name in remote_code_modules():
        shutil.copyfile(PACKAGE_DIR / f"{name}.py", out / f"{name}.py")
    entry = out / "dflash.py"
    entry.write_text(_ENTRY_POINT)
    return entry


FINGERPRINT_RTOL = 0.02


def target_fingerprint(target: PreTrainedModel) -> list[float]:
    """A short id of a target's token embedding, recorded in a drafter's config: the norms of 32 spread-out rows.

    It tells a drafter's own target from another model with the same shapes, without hashing every weight, and it
    survives a change of dtype (fp32, bf16, fp16) or a light quantization of the same weights: compare two with
    `fingerprints_match`, not with `==`.
    """
    from .quantization import dense

    weight = dense(target.get_input_embeddings().weight).detach()  # (vocab, hidden)
    rows = torch.linspace(0, weight.shape[0] - 1, steps=min(32, weight.shape[0])).long()
    norms = weight[rows].float().norm(dim=1).cpu()  # (32,)
    return [float(f"{value:.4g}") for value in norms.tolist()]


def fingerprints_match(recorded: list[float], actual: list[float], rtol: float = FINGERPRINT_RTOL) -> bool:
    """Whether two `target_fingerprint`s name the same embedding (every norm within `rtol`)."""
    if len(recorded) != len(actual):
        return False
    return all(abs(r - a) <= rtol * max(abs(r), abs(a), 1e-6) for r, a in zip(recorded, actual, strict=True))


def _table(rows: dict[str, str]) -> str:
    """Markdown rows `| name | value |` (pipes in values escaped)."""
    escaped = {k: str(v).replace("|", "\\|") for k, v in rows.items()}
    return "\n".join(f"| {k} | {v} |" for k, v in escaped.items())


def write_model_card(
    save_directory: str | Path,
    *,
    base_model: str,
    config: PretrainedConfig,
    repo_id: str | None = None,
    license: str = "apache-2.0",
    tau: float | None = None,
    training: dict[str, str] | None = None,
    command: str | None = None,
    datasets: list[str] | None = None,
    notes: str | None = None,
) -> Path:
    """Writes a Hub model card (`README.md`) for a drafter folder: YAML metadata, usage, training facts.

    Args:
        save_directory: the drafter folder (beside `config.json`).
        base_model: Hub id of the target the drafter was trained for.
        config: the drafter's `DFlashConfig` (block size, layers, target layers, mask id are listed).
        repo_id: the drafter's own Hub id, used in the title and snippets (default:
            `<your-name>/<target name>-DFlash-b<block size>`).
        license: SPDX id for the metadata (the target's license normally applies).
        tau: measured acceptance length on held-out prompts, if known.
        training: name -> value rows of the training table (data, steps, wall time, hardware, ...).
        command: the command line that trained it (shown as a code block).
        datasets: Hub dataset ids for the metadata.
        notes: markdown appended at the end (e.g. measured benchmark tables, facts about the target's weights).
    """
    out = Path(save_directory)
    out.mkdir(parents=True, exist_ok=True)
    block = config.block_size
    name = repo_id.split("/")[-1] if repo_id else f"{base_model.split('/')[-1]}-DFlash-b{block}"
    repo = repo_id or f"<your-name>/{name}"
    meta = [
        "---",
        f"base_model: {base_model}",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        f"license: {license}",
        "tags:\n- dflash\n- speculative-decoding\n- block-diffusion\n- draft-model",
    ]
    if datasets:
        meta.append("datasets:\n" + "\n".join(f"- {d}" for d in datasets))
    facts = {
        "target": f"[{base_model}](https://huggingface.co/{base_model})",
        "block size": str(block),
        "draft layers": str(config.num_hidden_layers),
        "target layers read (0-based)": str(config.target_layer_ids),
        "mask token id": str(config.mask_token_id),
        "acceptance length tau (greedy, held-out prompts)": f"{tau:.2f}" if tau is not None else "not measured",
    }
    card = f"""{chr(10).join(meta)}
---

# {name}

A [DFlash](https://arxiv.org/abs/2602.06036) block-diffusion drafter for speculative decoding with
**{base_model}**. It drafts {block - 1} tokens per forward pass, conditioned on the target's hidden states;
the target verifies them in one forward, so the output is exactly the target's (identical under greedy
decoding, the same distribution under sampling). It has no embedding or LM head of its own: it uses the
target's. Layout and config follow the z-lab DFlash checkpoints, so vLLM and SGLang load it as they load those.

| | |
|---|---|
{_table(facts)}

## Usage

Transformers (with `pip install transformers-dflash`):

```python
import transformers_dflash  # registers DFlash with generate()
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers_dflash import DFlashDraftModel

target = AutoModelForCausalLM.from_pretrained("{base_model}", dtype="auto")
drafter = DFlashDraftModel.from_pretrained("{repo}", dtype=target.dtype)
tok = AutoTokenizer.from_pretrained("{base_model}")
inputs = tok.apply_chat_template(
    [{{"role": "user", "content": "Hi!"}}], add_generation_prompt=True, return_tensors="pt", return_dict=True
)
out = target.generate(**inputs, assistant_model=drafter, max_new_tokens=256)
```

Without the package: `AutoModel.from_pretrained("{repo}", trust_remote_code=True)` loads the drafter from the
shipped `dflash.py`, and `target.generate(..., assistant_model=drafter, speculation_type="dflash")` runs it
(Transformers >= 5.23).

vLLM:

```bash
vllm serve {base_model} \\
  --speculative-config '{{"method": "dflash", "model": "{repo}", "num_speculative_tokens": {block - 1}}}'
```

SGLang:

```bash
python -m sglang.launch_server --model-path {base_model} \\
  --speculative-algorithm DFLASH --speculative-draft-model-path {repo} --trust-remote-code
```
"""
    if training or command:
        card += "\n## Training\n\nTrained with `dflash-train` from transformers-dflash.\n"
        card += f"\n```bash\n{command}\n```\n" if command else ""
        card += f"\n| | |\n|---|---|\n{_table(training)}\n" if training else ""
    card += f"\n{notes.strip()}\n" if notes else ""
    path = out / "README.md"
    path.write_text(card)
    return path
