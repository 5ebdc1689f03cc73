"""SlotCache: a preallocated key/value cache that each row writes at its own positions.

Transformers' `StaticCache` appends at one shared length for the whole batch. Speculative decoding of a batch needs
ragged writes: every row accepts its own number of tokens per step. Here slot == absolute token position: before a
forward the caller names the slot of every new token (`write_at`), the attention layers' `cache.update` scatters the
new keys/values there, and the caller's 4D mask decides which slots each query sees. Rejected tokens are simply
overwritten by the next step; nothing is ever concatenated or cropped. The last slot is a write-only sink for tokens
that must not be kept (left padding, rejected context). A forward may read only the first `visible` slots (eager
decoding: the tail no row has reached yet is skipped); compiled steps read them all.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    """One layer's (b, kv_heads, capacity, d) key and value buffers, allocated once."""

    is_compileable = True
    is_sliding = False

    def __init__(self, shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.buffers = (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        self.keys, self.values = self.buffers  # the first rows of the buffers while finished rows have left
        self.device, self.max_cache_len, self.is_initialized = device, shape[2], True
        if not torch.compiler.is_compiling():  # fixed addresses: in-place writes keep CUDA graphs valid
            for buffer in self.buffers:
                torch._dynamo.mark_static_address(buffer)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the buffers are allocated in `__init__`."""

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        slots: torch.Tensor,
        visible: int | None = None,
        *args,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes `key_states`/`value_states` (b, kv_heads, t, d) at `slots` (b, t); returns the buffers' first
        `visible` slots (views; None: all of them)."""
        index = slots[:, None, :, None].expand(-1, key_states.shape[1], -1, key_states.shape[-1])  # (b, h, t, d)
        self.keys.scatter_(2, index, key_states.to(self.keys.dtype))
        self.values.scatter_(2, index, value_states.to(self.values.dtype))
        if visible is None:
            return self.keys, self.values
        return self.keys[:, :, :visible], self.values[:, :, :visible]

    def keep_rows(self, index: torch.Tensor | None) -> None:
        """Moves rows `index` to the front and narrows the cache to them; None restores every row."""
        if index is None:
            self.keys, self.values = self.buffers
            return
        n = len(index)
        self.keys = self.buffers[0][:n].copy_(self.keys[index])  # the gather copies before the overwrite
        self.values = self.buffers[1][:n].copy_(self.values[index])

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.max_cache_len, 0

    def get_seq_length(self) -> int:
        return self.max_cache_len

    def get_max_length(self) -> int:
        return self.max_cache_len


class SlotCache(Cache):
    """Keys/values of every layer for `batch` rows and `capacity` positions, written by position per row.

    Call `write_at(slots)` with the (b, t) positions of the t new tokens before each forward; tokens to discard go
    to `sink` (the last slot, which no query may see).
    """

    def __init__(
        self,
        num_layers: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (batch, kv_heads, capacity, head_dim)
        super().__init__(layers=[SlotLayer(shape, dtype, device) for _ in range(num_layers)])
        self.batch, self.capacity, self.dtype, self.device = batch, capacity, dtype, torch.device(device)
        self.slots = torch.zeros(batch, 0, dtype=torch.long, device=device)
        self.visible: int | None = None

    @classmethod
    def for_config(
        cls, config: PretrainedConfig, batch: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> SlotCache:
        """A cache shaped for a Llama-like decoder `config` (its text config for multimodal ones)."""
        text = config.get_text_config()
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        return cls(text.num_hidden_layers, batch, kv_heads, head_dim, capacity, dtype, device)

    @property
    def sink(self) -> int:
        """The slot that absorbs writes to be discarded; masks must hide it."""
        return self.capacity - 1

    def fits(self, batch: int, capacity: int, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether this cache can serve a request of that shape (so that it is reused rather than reallocated)."""
        return (self.batch, self.dtype, self.device) == (batch, dtype, device) and capacity <= self.capacity

    def keep_rows(self, index: torch.Tensor | None) -> None:
        """Keeps only rows `index` (in that order), for example when finished rows leave the batch, without
        reallocating; None restores all `batch` rows (their contents are then stale)."""
        for layer in self.layers:
            layer.keep_rows(index)

    def write_at(self, slots: torch.Tensor, visible: int | None = None) -> None:
        """Sets the (b, t) slots the next forward's t new tokens are written to, and how many leading slots its
        attention reads (None: every slot, the fixed shape compiled steps need; fewer skips the unwritten tail)."""
        self.slots, self.visible = slots, visible

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Called by the attention layers: scatters the new keys/values at `self.slots`."""
        return self.layers[layer_idx].update(key_states, value_states, self.slots, self.visible)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions this cache can hold; rows fill it to different lengths, so callers pass `position_ids`."""
        return self.capacity - 1

    @property
    def nbytes(self) -> int:
        """Bytes held by all key and value buffers."""
        return sum(buffer.nbytes for layer in self.layers for buffer in layer.buffers)
