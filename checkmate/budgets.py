"""Memory budgets as people write them: parsing (``"2GiB"``, ``"1.5GB"``, ``"60%"``,
``"50% activations"``) and printing.

A bare percentage refers to the checkpoint-all peak (:func:`checkmate.bounds.checkpoint_all_peak`).
A percentage of the activations (``"50% activations"``, ``"50% of activations"``, ``"50% activation
memory"``) refers to the memory a step uses above what any schedule must hold: the graph's fixed
bytes (parameters, the batch, the optimizer state and, in a compact graph, the gradients) and its
outputs (the loss, the parameter gradients, kept to the end of the step). ``"100% activations"`` is
the checkpoint-all peak, ``"0% activations"`` that floor (:func:`activation_reference`).
A plain byte count must be whole (``1.5`` or ``"1.5B"`` is refused, not floored); a size in larger
units or a percentage is rounded down to whole bytes (``"1.1KiB"`` is 1126 bytes).
"""

from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from checkmate.bounds import checkpoint_all_peak
from checkmate.errors import InvalidBudgetError

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["parse_budget", "format_bytes", "MAX_BUDGET_BYTES", "activation_reference", "budget_fraction",
           "is_relative_budget", "describe_fraction"]

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
# Graph sizes are validated below 2^63 bytes (docs/design.md §4), and solvers hold budgets in 64-bit
# integers or doubles; a larger budget is a typo, not a machine.
MAX_BUDGET_BYTES = 2**63
_MAX_EXPONENT = 400          # |e| beyond this is out of range whatever the mantissa (digits are bounded too)
_MAX_SHOWN_CHARS = 40
_BUDGET_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z%]*)\s*$")
_ACTIVATIONS_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*(?:of\s+)?(?:the\s+)?activations?(?:\s+memory)?\s*$",
                             re.IGNORECASE)
_SYNTAX = "give bytes, '2GiB', '1.5GB', '60%' or '50% activations'"


def activation_reference(graph: "Graph") -> tuple[int, int]:
    """``(floor_bytes, activation_bytes)`` of ``graph``: the bytes every schedule holds (fixed bytes
    plus every output node's value, all resident at the end of the step) and the checkpoint-all peak's
    memory above them, to which ``"X% activations"`` refers."""
    floor = int(graph.fixed_mem) + int(np.asarray(graph.mem)[np.asarray(graph.output, dtype=bool)].sum())
    return floor, max(checkpoint_all_peak(graph) - floor, 0)


def is_relative_budget(budget: Any) -> bool:
    """Whether ``budget`` is a share of a graph's own reference (``"60%"``, ``"50% activations"``)."""
    return isinstance(budget, str) and "%" in budget


def budget_fraction(budget_bytes: int, graph: "Graph", budget: Any) -> float | None:
    """``budget_bytes`` as the percentage of the reference ``budget`` was given in (the checkpoint-all
    peak, or the activations for ``"X% activations"``); ``None`` for a budget in bytes."""
    if not is_relative_budget(budget):
        return None
    if _ACTIVATIONS_RE.match(budget):
        floor, activations = activation_reference(graph)
        return 100.0 * (budget_bytes - floor) / activations if activations > 0 else None
    reference = checkpoint_all_peak(graph)
    return 100.0 * budget_bytes / reference if reference > 0 else None


def describe_fraction(budget_bytes: int, graph: "Graph", budget: Any) -> str:
    """``", 63.2% of the activations"`` (or ``"of checkpoint-all's peak"``) for a relative budget: how a
    budget in bytes reads in the terms the user gave theirs; empty for a budget in bytes."""
    fraction = budget_fraction(budget_bytes, graph, budget)
    if fraction is None:
        return ""
    what = "the activations" if _ACTIVATIONS_RE.match(budget) else "checkpoint-all's peak"
    return f", {fraction:.1f}% of {what}"


def parse_budget(budget: Any, graph: "Graph | None" = None) -> int:
    """Bytes from ``123``, ``"2GiB"``, ``"1.5GB"``, ``"512MiB"``, ``"60%"`` (of checkpoint-all's peak) or
    ``"50% activations"`` (of the activation memory, above the bytes every schedule holds)."""
    if isinstance(budget, bool):
        raise InvalidBudgetError(f"invalid budget {budget!r}")
    if isinstance(budget, numbers.Integral):
        return _bounded(int(budget), budget)
    if isinstance(budget, numbers.Real):
        value = float(budget)
        if not math.isfinite(value) or value <= 0:
            raise InvalidBudgetError(f"budget must be a positive number of bytes, got {budget!r}")
        if value < 1:
            raise _less_than_a_byte(budget, value)
        if not value.is_integer():
            raise _fractional_bytes(budget)
        return _bounded(int(value), budget)
    if not isinstance(budget, str):
        raise InvalidBudgetError(f"invalid budget {_short(budget)}: {_SYNTAX}")
    activations = _ACTIVATIONS_RE.match(budget)
    if activations:
        share = Fraction(activations.group(1))
        if share <= 0:
            raise InvalidBudgetError(f"budget must be positive, got {budget!r}")
        if graph is None:
            raise InvalidBudgetError(f"a budget in activations ({budget.strip()}) needs a graph to refer to")
        floor, activation_bytes = activation_reference(graph)
        return _bounded(floor + math.floor(activation_bytes * share / 100), budget, zero_ok=True)
    match = _BUDGET_RE.match(budget)
    if not match:
        raise InvalidBudgetError(f"invalid budget {_short(budget)}: {_SYNTAX}")
    exponent = re.search(r"[eE]([+-]?[0-9]+)$", match.group(1))
    if exponent and abs(int(exponent.group(1))) > _MAX_EXPONENT:
        # an exact Fraction of 1e99999999 would take minutes and gigabytes to build
        raise InvalidBudgetError(f"budget {_short(budget)} is out of range: budgets must be below 2^63 bytes")
    # Exact decimal arithmetic: in floating point "2.01GB" would come out one byte short.
    number, unit = Fraction(match.group(1)), match.group(2).lower()
    if number <= 0:
        raise InvalidBudgetError(f"budget must be positive, got {budget!r}")
    if unit == "%":
        if graph is None:
            raise InvalidBudgetError(f"a percentage budget ({budget}) needs a graph to refer to")
        # a percentage of a graph that needs no memory is 0 bytes, and that budget is met
        return _bounded(math.floor(checkpoint_all_peak(graph) * number / 100), budget, zero_ok=True)
    if unit not in _UNITS:
        raise InvalidBudgetError(f"unknown unit {match.group(2)!r} in budget {budget!r} "
                                 "(use B, KB, MB, GB, KiB, MiB, GiB or %)")
    if number * _UNITS[unit] < 1:
        raise _less_than_a_byte(budget, number if unit == "" else None)
    if _UNITS[unit] == 1 and number.denominator != 1:
        raise _fractional_bytes(budget)
    return _bounded(math.floor(number * _UNITS[unit]), budget)


def _bounded(value: int, budget: Any, *, zero_ok: bool = False) -> int:
    if value < 0 or (value == 0 and not zero_ok):
        raise InvalidBudgetError(f"budget must be a positive number of bytes, got {_short(budget)}")
    if value >= MAX_BUDGET_BYTES:
        raise InvalidBudgetError(f"budget {_short(budget)} is too large: budgets must be below 2^63 bytes")
    return value


def _short(budget: Any) -> str:
    """``repr(budget)``, cut short: an error message is one readable line."""
    text = repr(budget)
    return text if len(text) <= _MAX_SHOWN_CHARS else f"{text[:_MAX_SHOWN_CHARS]}... ({len(text)} characters)"


def _less_than_a_byte(budget: Any, number: Any) -> InvalidBudgetError:
    message = f"budget {budget!r} is less than one byte"
    if number is not None:
        # a bare 0.6 is more likely meant as a fraction of the checkpoint-all peak than as 0.6 bytes
        message += f"; for a fraction of the checkpoint-all peak give a percentage, e.g. '{float(number) * 100:g}%'"
    return InvalidBudgetError(message)


def _fractional_bytes(budget: Any) -> InvalidBudgetError:
    return InvalidBudgetError(f"budget {_short(budget)} is not a whole number of bytes; give whole bytes, a size "
                              "such as '2GiB', or a percentage such as '60%'")


def format_bytes(num: float | None) -> str:
    if num is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num) < 1024 or unit == "TiB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.2f} {unit}"
        num /= 1024
    return f"{num} B"  # unreachable
