"""Target features: the frozen target's hidden states that condition the drafter, online or from a disk cache.

`capture_features` runs the target once (no grad) and returns the concatenated hidden states of
`target_layer_ids` -- read through `hidden_state_indices`/`extract_context_features`, the same +1 offset inference
uses -- and optionally, from the same forward, the target's own argmax at every position and its top-k
log-probabilities (soft labels for distillation).

`FeatureCacheWriter` / `FeatureCache` keep those features as fp16 shards on disk, memory-mapped when read, so
several epochs reuse one target pass. Layout of a cache folder::

    meta.json        {"width", "target_layer_ids", "predictions", "top_k", "shard_tokens"}
    index.jsonl      one {"id", "shard", "row", "length"} per sequence, appended after its rows are on disk
    shard-00000.f16  raw float16 rows (tokens x width); shard-00000.i32 raw int32 argmax (with predictions)
    shard-00000.topi.i32, shard-00000.topp.f16   top-k ids and log-probabilities (tokens x k, with top_k > 0)

Writing is resumable: rows past the last indexed sequence (a killed run) are cut off and done ids skipped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from ..modeling_dflash import extract_context_features, hidden_state_indices
from .writer_lock import WriterLock


@dataclass
class TargetFeatures:
    """One target pass.

    Attributes:
        hidden: (b, n, F * H) concatenated hidden states of the target layers (the drafter's context input).
        predictions: (b, n) the target's argmax at each position (its guess for the NEXT token), or None.
        top_ids: (b, n, k) the target's k most likely next tokens at each position, or None.
        top_logprobs: (b, n, k) their log-probabilities (full-vocabulary softmax), or None.
    """

    hidden: torch.Tensor
    predictions: torch.LongTensor | None = None
    top_ids: torch.LongTensor | None = None
    top_logprobs: torch.Tensor | None = None


def _softcap(logits: torch.Tensor, target: PreTrainedModel) -> torch.Tensor:
    """The target's final logit soft-capping (Gemma-style `tanh(x / c) * c`), when its config has one."""
    cap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
    return logits if not cap else torch.tanh(logits / cap) * cap


@torch.no_grad()
def capture_features(
    target: PreTrainedModel,
    input_ids: torch.LongTensor,
    target_layer_ids: list[int],
    attention_mask: torch.Tensor | None = None,
    with_predictions: bool = False,
    top_k: int = 0,
    head_chunk: int = 1024,
) -> TargetFeatures:
    """Runs the frozen target on (b, n) `input_ids` and returns its features (and argmax / top-k when asked).

    The decoder runs once with `output_hidden_states=hidden_state_indices(target_layer_ids)`; the argmax and the
    top-k apply the target's LM head (and its logit soft-capping, if any) to the final hidden state in chunks of
    `head_chunk` positions, so the (n, vocab) logits never exist at once. `top_k > 0` implies predictions.
    """
    decoder = target.get_decoder()
    out = decoder(
        input_ids=input_ids,
        attention_mask=attention_mask,
        output_hidden_states=hidden_state_indices(target_layer_ids),
        use_cache=False,
    )
    hidden = extract_context_features(out.hidden_states, target_layer_ids)  # (b, n, F * H)
    if not (with_predictions or top_k):
        return TargetFeatures(hidden)
    head = target.get_output_embeddings()
    predictions, top_ids, top_logprobs = [], [], []
    for chunk in out.last_hidden_state.split(head_chunk, dim=1):  # each (b, <= chunk, H)
        logits = _softcap(head(chunk).float(), target)  # (b, <= chunk, V)
        predictions.append(logits.argmax(dim=-1))
        if top_k:
            values, ids = logits.topk(top_k, dim=-1)  # each (b, <= chunk, k)
            top_ids.append(ids)
            top_logprobs.append(values - logits.logsumexp(dim=-1, keepdim=True))
    if not top_k:
        return TargetFeatures(hidden, torch.cat(predictions, dim=1))
    return TargetFeatures(
        hidden, torch.cat(predictions, dim=1), torch.cat(top_ids, dim=1), torch.cat(top_logprobs, dim=1)
    )


# Per-shard files: kind -> (file suffix, numpy dtype). Rows are tokens; widths come from the cache's meta.
_SHARD_FILES = {
    "hidden": ("f16", np.float16),
    "predictions": ("i32", np.int32),
    "top_ids": ("topi.i32", np.int32),
    "top_logprobs": ("topp.f16", np.float16),
}


def _shard_path(directory: Path, shard: int, kind: str) -> Path:
    return directory / f"shard-{shard:05d}.{_SHARD_FILES[kind][0]}"


def _row_widths(width: int, predictions: bool, top_k: int) -> dict[str, int]:
    """Values per token of every file kind a cache with this layout stores (`_SHARD_FILES` order)."""
    widths = {"hidden": width}
    if predictions:
        widths["predictions"] = 1
    if top_k:
        widths.update(top_ids=top_k, top_logprobs=top_k)
    return widths


def _read_index(directory: Path) -> list[dict]:
    path = directory / "index.jsonl"
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    return [json.loads(line) for line in lines if line.endswith("\n")]  # a torn last line is not committed


class FeatureCacheWriter:
    """Appends one sequence's features at a time to a cache folder (see the module docstring).

    Args:
        directory: cache folder (created; an existing cache with the same layout is resumed).
        width: F * H, the feature width.
        target_layer_ids: recorded in `meta.json` and checked on resume.
        predictions: also store the target's argmax per position.
        top_k: also store the target's top-k ids and log-probabilities per position (implies predictions).
        shard_tokens: rows per shard file before a new one starts.
    """

    def __init__(
        self,
        directory: str | Path,
        width: int,
        target_layer_ids: list[int],
        predictions: bool = False,
        top_k: int = 0,
        shard_tokens: int = 65536,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = WriterLock(self.directory, "a feature cache")
        try:  # the lock is released if the folder holds another cache or a damaged one
            predictions = predictions or top_k > 0
            meta = {
                "width": width,
                "target_layer_ids": list(target_layer_ids),
                "predictions": predictions,
                "top_k": top_k,
            }
            meta_path = self.directory / "meta.json"
            if meta_path.exists():
                found = json.loads(meta_path.read_text())
                if {k: found.get(k, 0 if k == "top_k" else None) for k in meta} != meta:
                    raise ValueError(
                        f"{self.directory} holds a feature cache for {found}, not {meta}; use another folder."
                    )
                shard_tokens = found["shard_tokens"]
            else:
                meta_path.write_text(json.dumps({**meta, "shard_tokens": shard_tokens}) + "\n")
            self.width, self.predictions, self.top_k, self.shard_tokens = width, predictions, top_k, shard_tokens
            index = _read_index(self.directory)
            self.done = {entry["id"] for entry in index}
            last = index[-1] if index else {"shard": 0, "row": 0, "length": 0}
            self.shard, self.rows = last["shard"], last["row"] + last["length"]
            self._truncate_uncommitted()
            self._index = (self.directory / "index.jsonl").open("a", encoding="utf-8")
        except BaseException:
            self._lock.release()
            raise

    @property
    def row_widths(self) -> dict[str, int]:
        """Values per token of every file kind this cache stores."""
        return _row_widths(self.width, self.predictions, self.top_k)

    def _truncate_uncommitted(self) -> None:
        """Cuts rows a killed run wrote after its last index entry, and removes later shards."""
        for kind, width in self.row_widths.items():
            path = _shard_path(self.directory, self.shard, kind)
            if path.exists():
                with path.open("r+b") as handle:
                    handle.truncate(self.rows * width * np.dtype(_SHARD_FILES[kind][1]).itemsize)
        for path in self.directory.glob("shard-*"):
            if int(path.name[6:11]) > self.shard:
                path.unlink()

    def write(self, sequence_id: str, features: TargetFeatures) -> None:
        """Appends the features of one sequence (batch 1, as `capture_features` returns them) for `sequence_id`."""
        hidden = features.hidden
        if hidden.dim() != 3 or hidden.shape[0] != 1 or hidden.shape[2] != self.width:
            raise ValueError(f"Expected features of shape (1, n, {self.width}), got {tuple(hidden.shape)}.")
        for kind, width in self.row_widths.items():
            value = getattr(features, kind)
            if value is None:
                raise ValueError(f"This cache stores {kind} (top_k={self.top_k}); the features have none.")
            if value.shape[1] != hidden.shape[1] or (kind.startswith("top") and value.shape[-1] != width):
                raise ValueError(f"{kind} of shape {tuple(value.shape)} does not fit this cache (width {width}).")
        if self.rows and self.rows + hidden.shape[1] > self.shard_tokens:
            self.shard, self.rows = self.shard + 1, 0
        for kind in self.row_widths:
            with _shard_path(self.directory, self.shard, kind).open("ab") as handle:
                value = getattr(features, kind)[0].detach().cpu()
                value = value.float() if value.is_floating_point() else value  # numpy has no bfloat16
                handle.write(value.numpy().astype(_SHARD_FILES[kind][1]).tobytes())
                os.fsync(handle.fileno())
        entry = {"id": sequence_id, "shard": self.shard, "row": self.rows, "length": hidden.shape[1]}
        self._index.write(json.dumps(entry) + "\n")
        self._index.flush()
        self.rows += hidden.shape[1]
        self.done.add(sequence_id)

    def close(self) -> None:
        """Closes the index file and lets another writer in."""
        self._index.close()
        self._lock.release()


class FeatureCache:
    """Read side of a feature cache: features of a sequence by id, memory-mapped from the shard files."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        meta_path = self.directory / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"{self.directory} is not a feature cache (no meta.json); run `features` first.")
        meta = json.loads(meta_path.read_text())
        self.width: int = meta["width"]
        self.target_layer_ids: list[int] = meta["target_layer_ids"]
        self.has_predictions: bool = meta["predictions"]
        self.top_k: int = meta.get("top_k", 0)
        self.row_widths = _row_widths(self.width, self.has_predictions, self.top_k)
        self.entries = {entry["id"]: entry for entry in _read_index(self.directory)}
        self._maps: dict[tuple[int, str], np.memmap] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, sequence_id: str) -> bool:
        return sequence_id in self.entries

    def _map(self, shard: int, kind: str) -> np.memmap:
        if (shard, kind) not in self._maps:
            width = self.row_widths[kind]
            raw = np.memmap(_shard_path(self.directory, shard, kind), dtype=_SHARD_FILES[kind][1], mode="r")
            self._maps[shard, kind] = raw.reshape(-1, width) if width > 1 else raw
        return self._maps[shard, kind]

    def get(self, sequence_id: str) -> TargetFeatures:
        """One sequence's features, copied out of the maps: (1, n, width) fp16 hidden states, and when stored
        (1, n) predictions and (1, n, k) top-k ids / fp16 log-probabilities."""
        entry = self.entries.get(sequence_id)
        if entry is None:
            raise KeyError(f"Sequence {sequence_id!r} is not in the feature cache {self.directory}; rerun `features`.")
        rows = slice(entry["row"], entry["row"] + entry["length"])

        found = {}
        for kind in self.row_widths:
            value = torch.from_numpy(np.array(self._map(entry["shard"], kind)[rows]))[None]
            found[kind] = value.long() if _SHARD_FILES[kind][1] == np.int32 else value  # ids as torch indices
        return TargetFeatures(**found)


def build_feature_cache(
    target: PreTrainedModel,
    sequences: Iterable[tuple[str, list[int]]],
    directory: str | Path,
    target_layer_ids: list[int],
    with_predictions: bool = False,
    total: int | None = None,
    top_k: int = 0,
) -> FeatureCache:
    """Runs the target once over `(id, token ids)` sequences and stores their features in `directory`.

    Resumable: ids already in the cache are skipped. Returns the cache opened for reading.
    """
    width = target.config.get_text_config().hidden_size * len(target_layer_ids)
    writer = FeatureCacheWriter(directory, width, target_layer_ids, predictions=with_predictions, top_k=top_k)
    device = next(target.parameters()).device
    tokens, start = 0, time.perf_counter()
    try:
        with tqdm(sequences, total=total, desc="features", unit="seq") as bar:
            for sequence_id, ids in bar:
                if sequence_id in writer.done:
                    continue
                ids_tensor = torch.tensor([ids], device=device)
                writer.write(
                    sequence_id,
                    capture_features(
                        target, ids_tensor, target_layer_ids, with_predictions=writer.predictions, top_k=top_k
                    ),
                )
                tokens += len(ids)
                bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.0f}")
    finally:
        writer.close()
    return FeatureCache(directory)


class FeatureSource:
    """Features for a batch of sequences: read from feature caches when given, else computed by the target.

    Several caches serve one run (e.g. the caches of earlier stages replayed together); a sequence is read from the
    first cache that holds its id. A cache built for more target layers serves a drafter that reads a subset of
    them (e.g. a 5-layer cache for 3-layer ablations).

    Returns features right-padded with zeros to the longest sequence (b, n_max, F * H) on `device`, with
    predictions (b, n_max) when `with_predictions` and the top-k (b, n_max, k) when `top_k` (the caches must then
    hold them; a cache with a larger k serves a smaller one).
    """

    def __init__(
        self,
        target: PreTrainedModel,
        target_layer_ids: list[int],
        cache: FeatureCache | Sequence[FeatureCache] | None = None,
        with_predictions: bool = False,
        top_k: int = 0,
    ) -> None:
        caches = [] if cache is None else [cache] if isinstance(cache, FeatureCache) else list(cache)
        # per cache, which of its layers the drafter reads, in the drafter's order (None: all, as stored)
        self.caches: list[tuple[FeatureCache, list[int] | None]] = []
        for one in caches:
            missing = [layer for layer in target_layer_ids if layer not in one.target_layer_ids]
            if missing:
                raise ValueError(
                    f"The feature cache {one.directory} holds target layers {one.target_layer_ids}, the drafter reads "
                    f"{list(target_layer_ids)} ({missing} missing); rebuild the cache or match --target-features."
                )
            if with_predictions and not one.has_predictions:
                raise ValueError(
                    f"Target-argmax labels need predictions in the feature cache {one.directory}; rebuild it with them."
                )
            if one.top_k < top_k:
                raise ValueError(
                    f"Distillation reads the target's top-{top_k} per position, the feature cache {one.directory} "
                    f"holds the top-{one.top_k}; rebuild it with `features --top-k {top_k}` (or lower --top-k)."
                )
            same = list(target_layer_ids) == one.target_layer_ids
            self.caches.append((one, None if same else [one.target_layer_ids.index(x) for x in target_layer_ids]))
        self.target, self.target_layer_ids = target, list(target_layer_ids)
        self.with_predictions, self.top_k = with_predictions or top_k > 0, top_k

    @property
    def kind(self) -> str:
        """ "cached" or "online"."""
        return "cached" if self.caches else "online"

    def uncached(self, sequence_ids: Iterable[str]) -> list[str]:
        """The ids none of the caches holds (all of them when features are computed online)."""
        return [i for i in sequence_ids if not any(i in one for one, _ in self.caches)]

    def _cached(self, sequence_id: str) -> TargetFeatures:
        """One sequence's features from the first cache holding it, (1, n, F * H) in the drafter's layer order."""
        for one, slots in self.caches:
            if sequence_id in one:
                found = one.get(sequence_id)
                if slots is not None:
                    _, n, width = found.hidden.shape
                    per_layer = found.hidden.view(1, n, len(one.target_layer_ids), width // len(one.target_layer_ids))
                    found.hidden = per_layer[:, :, slots].reshape(1, n, -1)  # (1, n, F * H)
                return found
        where = ", ".join(str(one.directory) for one, _ in self.caches)
        raise KeyError(f"Sequence {sequence_id!r} is in none of the feature caches ({where}); rerun `features`.")

    def online(self, input_ids: torch.LongTensor, lengths: torch.LongTensor) -> TargetFeatures:
        """Features computed by the target for (b, n) right-padded `input_ids` with (b,) `lengths`, on their device
        (causal attention: the real positions of each row are exact)."""
        mask = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :] < lengths[:, None]  # (b, n)
        return capture_features(
            self.target, input_ids, self.target_layer_ids, mask.long(), self.with_predictions, top_k=self.top_k
        )

    def __call__(self, sequences: list[tuple[str, torch.LongTensor]], device: torch.device) -> TargetFeatures:
        """Features of `(id, (n_i,) token ids)` sequences."""
        lengths = [ids.shape[0] for _, ids in sequences]
        if not self.caches:
            ids = torch.nn.utils.rnn.pad_sequence([seq for _, seq in sequences], batch_first=True)  # (b, n)
            return self.online(ids.to(device), torch.tensor(lengths, device=device))
        parts = [self._cached(sequence_id) for sequence_id, _ in sequences]
        for part, length, (sequence_id, _) in zip(parts, lengths, sequences, strict=True):
            if part.hidden.shape[1] < length:  # a longer cached sequence is fine: features are causal, use a prefix
                raise ValueError(
                    f"Cached features of {sequence_id!r} cover {part.hidden.shape[1]} tokens, the sequence has "
                    f"{length}; the cache was built for other data or a shorter --max-seq-len."
                )

        def padded(kind: str) -> torch.Tensor:
            rows = [getattr(p, kind)[0, :length] for p, length in zip(parts, lengths, strict=True)]
            return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True).to(device)  # (b, n, ...)

        found = TargetFeatures(padded("hidden"))  # (b, n, F * H)
        if self.with_predictions:
            found.predictions = padded("predictions")  # (b, n)
        if self.top_k:
            found.top_ids = padded("top_ids")[..., : self.top_k]  # (b, n, k)
            found.top_logprobs = padded("top_logprobs")[..., : self.top_k]
        return found
