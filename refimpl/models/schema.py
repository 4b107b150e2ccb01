"""The rules a config.json's values must follow before refimpl plans from them.

transformers' config classes are strict in version 5 (`@strict` dataclasses): a count is an
`int`, never a bool, a float or a string, and each class checks its own consistency rules
(`validate_architecture`: "mamba_n_heads must divide mamba_expand * hidden_size", the hidden
size a multiple of the heads, `layer_types` from a fixed list and one entry per layer). vLLM
builds its model from such a config, so a file transformers refuses never reaches its planner.
refimpl reads the JSON itself, so it applies the same rules here, plus bounds that keep a
typo (`"num_hidden_layers": 1e9`) from planning a billion layers: the largest public models
are far inside them.

Every refusal is one `ValueError` line naming the field, its value and the rule.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from refimpl.validation import is_integer


@dataclass(frozen=True)
class Bound:
    """What one kind of field may hold: an integer from `minimum` to `maximum`."""

    what: str
    maximum: int
    minimum: int = 1

    def rule(self, minimum: int, maximum: int) -> str:
        return f"{self.what} must be an integer from {minimum:,} to {maximum:,}"


#: Bounds by kind; the largest public models use under 200 layers, 128 heads per layer, a
#: hidden size of 25,600 and 10.5M-token contexts.
LAYERS = Bound("a layer count", 1024)
HEADS = Bound("a head or group count", 4096)
SIZE = Bound("a size", 1 << 20)
CONTEXT = Bound("a token count", (1 << 31) - 1)
#: Fields read as layer counts, head counts or token counts; any other integer is a size.
_KIND_BY_NAME = {
    "num_hidden_layers": LAYERS,
    "num_nextn_predict_layers": LAYERS,
    "max_window_layers": LAYERS,
    "first_k_dense_replace": LAYERS,
    "full_attention_interval": LAYERS,
    "sliding_window_pattern": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS,
    "mamba_n_heads": HEADS,
    "mamba_n_groups": HEADS,
    "linear_num_key_heads": HEADS,
    "linear_num_value_heads": HEADS,
    "sliding_window": CONTEXT,
    "attention_chunk_size": CONTEXT,
    "max_model_len": CONTEXT,
}


def bound_for(field: str) -> Bound:
    """The bound a field's kind sets: named fields first, then by the name's wording."""
    if field in _KIND_BY_NAME:
        return _KIND_BY_NAME[field]
    if field.endswith("layers"):
        return LAYERS
    if "heads" in field or "groups" in field:
        return HEADS
    if any(word in field for word in ("position", "seq_len", "length", "max_seq", "window")):
        return CONTEXT
    return SIZE


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_config_int(
    field: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    source: str = "<dict>",
) -> int:
    """`value` as an int if it is one (not a bool, a float or a string, as transformers'
    strict classes require) within the field's bounds, else a one-line ValueError."""
    bound = bound_for(field)
    low = bound.minimum if minimum is None else minimum
    high = bound.maximum if maximum is None else maximum
    if not is_integer(value):
        raise ValueError(
            f"{source}: {field} = {_shown(value)} is a {type(value).__name__}; "
            f'{bound.rule(low, high)} (JSON like 32, not 32.0, true or "32")'
        )
    if not low <= value <= high:
        rule = bound.rule(low, high)
        raise ValueError(f"{source}: {field} = {value:,} is out of range; {rule}")
    return int(value)


def check_config_bool(field: str, value: object, *, source: str = "<dict>") -> bool:
    """`value` if it is a JSON true/false (a string "false" would read as true)."""
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {field} = {_shown(value)} must be true or false")
    return value


def check_config_number(field: str, value: object, *, source: str = "<dict>") -> float:
    """A positive finite number (a scaling factor); 0 is refused, never read as 'unset'."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{source}: {field} = {_shown(value)} must be a positive number")
    return value


def check_layer_types(
    value: object, allowed: Collection[str], num_layers: int, *, source: str = "<dict>"
) -> list[str]:
    """`layer_types` as transformers' `validate_layer_type` takes it: a list of names from
    `allowed` (the kinds this family's vLLM model builds), one per layer."""
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"{source}: layer_types = {_shown(value)} must be a list of names")
    if len(value) != num_layers:
        raise ValueError(
            f"{source}: layer_types lists {len(value):,} layers; it must list one entry per "
            f"layer (num_hidden_layers = {num_layers:,})"
        )
    for i, kind in enumerate(value):
        if kind not in allowed:
            raise ValueError(
                f"{source}: layer_types[{i}] = {_shown(kind)} is not a layer kind this model "
                f"has; allowed: {', '.join(sorted(allowed))}"
            )
    return list(value)


def check_divides(
    divisor_field: str,
    divisor: int,
    dividend_what: str,
    dividend: int,
    *,
    rule: str,
    source: str = "<dict>",
) -> None:
    """A consistency rule of the form "`divisor_field` must divide `dividend_what`"."""
    if dividend % divisor:
        raise ValueError(
            f"{source}: {divisor_field} = {divisor:,} does not divide {dividend_what} = "
            f"{dividend:,} ({rule})"
        )
