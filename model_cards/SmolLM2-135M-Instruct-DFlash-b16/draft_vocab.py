"""A drafter's draft vocabulary: the token ids it may propose, and the head restricted to them.

`dflash-train` scores its loss over the tokens of the training responses only (`--restricted-vocab`, the default);
the drafter never learns to push the other rows of the target's head down, so at inference a draft over the full
head can land on a token it was never trained on. The draft vocabulary closes that gap and is also faster: the
drafter's head reads those rows only (on a 2-core CPU, ~15K of SmolLM2's 49,152 rows cost ~1/3 of the full head).
Verification still uses the target's full head, so decoding stays lossless; a token outside the vocabulary is
simply never drafted.

It travels beside the weights as `draft_vocab.safetensors` (one int64 tensor `draft_vocab`, sorted unique ids):
`model.safetensors` keeps exactly the z-lab parameter names, and vLLM, SGLang and z-lab's remote code, which do
not read the file, draft over the full head as before.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.utils import cached_file

DRAFT_VOCAB_FILE = "draft_vocab.safetensors"
_TENSOR = "draft_vocab"


def check_draft_vocab(ids: torch.Tensor, vocab_size: int) -> torch.LongTensor:
    """`ids` as a sorted, unique int64 tensor of token ids below `vocab_size`, or a ValueError naming the problem."""
    if ids.dim() != 1 or ids.numel() == 0 or ids.is_floating_point():
        raise ValueError(f"A draft vocabulary is a non-empty 1-D tensor of token ids, got shape {tuple(ids.shape)}.")
    ids = torch.unique(ids.long())  # sorted
    if ids[0] < 0 or ids[-1] >= vocab_size:
        raise ValueError(
            f"Draft vocabulary ids must lie in [0, {vocab_size}) (the target's vocabulary), got {ids[0]}..{ids[-1]}: "
            "it was built for another tokenizer."
        )
    return ids


def save_draft_vocab(ids: torch.Tensor, directory: str | Path) -> Path:
    """Writes `ids` to `directory/draft_vocab.safetensors`; returns the path."""
    path = Path(directory) / DRAFT_VOCAB_FILE
    save_file({_TENSOR: ids.detach().to("cpu", torch.int64).contiguous()}, str(path))
    return path


def load_draft_vocab(name_or_path: str | Path, **hub_kwargs: object) -> torch.LongTensor | None:
    """The draft vocabulary stored with a checkpoint (a folder or a Hub id), or None when it has none."""
    local = Path(name_or_path) / DRAFT_VOCAB_FILE
    if local.is_file():
        path: str | None = str(local)
    elif Path(name_or_path).is_dir():
        return None
    else:
        keep = ("cache_dir", "revision", "token", "local_files_only", "subfolder")
        kwargs = {k: v for k, v in hub_kwargs.items() if k in keep and v is not None}
        path = cached_file(str(name_or_path), DRAFT_VOCAB_FILE, _raise_exceptions_for_missing_entries=False, **kwargs)
    return None if path is None else load_file(path)[_TENSOR]


class DraftHead:
    """The drafter's output head: the target's head, over the draft vocabulary only when the drafter has one.

    `update` follows the target's head and the vocabulary; with a vocabulary it copies the head's rows (and bias)
    for it, again only when the head's weight or the vocabulary changed (device, dtype or storage), so that a call
    reads ~|vocabulary| rows instead of all V and returns full-width logits, -inf outside the vocabulary.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self.head: nn.Module | None = None
        self.vocab = self.weight = self.bias = None

    def update(self, head: nn.Module, vocab: torch.LongTensor | None) -> None:
        """Follows the target's `head` and the drafter's `vocab` (None: the whole vocabulary)."""
        self.head, weight = head, head.weight
        key = None if vocab is None else (weight.data_ptr(), weight.device, weight.dtype, vocab.data_ptr())
        if key == self._key:
            return
        self._key, self.vocab = key, None if vocab is None else vocab.to(weight.device)
        self.weight = None if vocab is None else weight.detach().index_select(0, self.vocab)  # (K, H)
        bias = getattr(head, "bias", None)
        self.bias = None if vocab is None or bias is None else bias.detach().index_select(0, self.vocab)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of the drafter's hidden states (..., H)."""
        weight = self.head.weight
        if self.vocab is None:
            return self.head(hidden.to(weight.dtype))
        small = nn.functional.linear(hidden.to(weight.dtype), self.weight, self.bias)  # (..., K)
        full = small.new_full((*small.shape[:-1], weight.shape[0]), float("-inf"))  # (..., V)
        return full.index_copy_(-1, self.vocab, small)
