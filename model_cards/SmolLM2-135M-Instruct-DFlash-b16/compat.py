"""Every difference between the supported Transformers versions (5.23 and 5.24) that this package bridges.

One helper per difference. Shipped with the drafter's remote code (`modeling_dflash` imports it), so it imports
only torch and transformers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from transformers.modeling_outputs import BaseModelOutputWithPast


def cache_field(output_class: type = BaseModelOutputWithPast) -> str:
    """The name of a model output's cache field: `cache` from Transformers 5.24 on, `past_key_values` in 5.23."""
    return "cache" if "cache" in output_class.__dataclass_fields__ else "past_key_values"


def cache_kwarg(forward: Callable[..., Any]) -> str:
    """The name under which `forward` (a model's) takes its cache: `cache` from Transformers 5.24 on (5.24
    deprecates the old name across the library), `past_key_values` in 5.23. Our drafter accepts both."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def model_output(last_hidden_state: Any, cache: Any) -> BaseModelOutputWithPast:
    """`BaseModelOutputWithPast` carrying `cache` under this Transformers version's field name."""
    return BaseModelOutputWithPast(last_hidden_state=last_hidden_state, **{cache_field(): cache})
