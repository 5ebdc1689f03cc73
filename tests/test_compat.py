"""The Transformers-version shims (`compat.py`), each checked against both supported versions' conventions.

The installed version runs one side for real; the other is a stand-in with that version's signature or fields, so
`make test` (5.24) and `make test-compat` (5.23) both cover both paths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from conftest import make_drafter, make_target
from transformers.modeling_outputs import BaseModelOutputWithPast

from transformers_dflash.compat import cache_field, cache_kwarg, model_output


def forward_5_23(input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None):
    """A model forward as Transformers 5.23 declares it."""


def forward_5_24(input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None, **kwargs):
    """A model forward as Transformers 5.24 declares it (`past_key_values` deprecated, only through **kwargs)."""


@dataclass
class Output523:
    last_hidden_state: torch.Tensor | None = None
    past_key_values: object = None


@dataclass
class Output524:
    last_hidden_state: torch.Tensor | None = None
    cache: object = None


def test_cache_kwarg_5_23() -> None:
    assert cache_kwarg(forward_5_23) == "past_key_values"


def test_cache_kwarg_5_24() -> None:
    assert cache_kwarg(forward_5_24) == "cache"


def test_cache_field_5_23() -> None:
    assert cache_field(Output523) == "past_key_values"


def test_cache_field_5_24() -> None:
    assert cache_field(Output524) == "cache"


def test_installed_version_agrees_with_itself() -> None:
    target = make_target()
    field = cache_field()
    assert field in BaseModelOutputWithPast.__dataclass_fields__
    assert cache_kwarg(target.forward) == field  # the installed Transformers names input and output alike
    assert cache_kwarg(make_drafter(target).forward) == "cache"  # ours takes both names; `cache` is preferred
    sentinel = object()
    out = model_output(torch.zeros(1, 2, 3), sentinel)
    assert getattr(out, field) is sentinel and out.last_hidden_state.shape == (1, 2, 3)
