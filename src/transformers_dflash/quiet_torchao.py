"""Mutes the import-time noise of torchao (when installed), which Transformers imports while loading its quantizers.

Two kinds of records, nothing else, are dropped:
- torchao's "Failed to load .../_C_*.so" warnings, one per CUDA-only kernel library, on a host without CUDA (where
  those kernels are never used; on a GPU host they stay visible);
- torch's "<enum ...> is an Enum subclass and is now natively supported by torch.compile" deprecation notes that
  torchao 0.18's `register_constant` calls raise under torch 2.13.
Importing this module installs the filters.
"""

from __future__ import annotations

import logging

import torch


class _Drop(logging.Filter):
    """Drops the records whose message satisfies `match`."""

    def __init__(self, name: str, match: str, *, also: str = "") -> None:
        super().__init__()
        self.key, self.match, self.also = name, match, also

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (self.match in message and self.also in message)


def mute_torchao_import_noise() -> None:
    """Installs the filters (idempotent; see the module doc)."""
    filters = [("torch.utils._pytree", "is an Enum subclass and is now natively supported", "")]
    if not torch.cuda.is_available():
        filters.append(("torchao", "Failed to load ", "/_C_"))
    for logger_name, match, also in filters:
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _Drop) and f.key == logger_name for f in logger.filters):
            logger.addFilter(_Drop(logger_name, match, also=also))


mute_torchao_import_noise()
