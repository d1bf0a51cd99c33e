"""The minimum budget auto names when it refuses one is met by a later solve at that budget in the
same process, even when that solve's own search stops above it (a time limit on a busy machine):
the refusal keeps the least-peak schedule it reached."""

from __future__ import annotations

import pytest

import checkmate
import checkmate.solvers.auto as auto_module
from checkmate.bounds import largest_working_set_bytes
from checkmate.errors import InfeasibleBudgetError
from checkmate.simulate import simulate

from cases import assert_valid_schedule
from quality_graphs import long_skip_unet


@pytest.fixture
def graph():
    auto_module._LEAST_PEAK_SCHEDULES.clear()
    yield long_skip_unet(levels=2)
    auto_module._LEAST_PEAK_SCHEDULES.clear()


def _refused_minimum(graph) -> int:
    with pytest.raises(InfeasibleBudgetError) as info:
        checkmate.solve(graph, largest_working_set_bytes(graph) - 1, strategy="auto", time_limit_s=5)
    found = info.value.min_feasible_budget_bytes
    assert found is not None
    return int(found)


def _no_search_reaches_a_schedule(monkeypatch):
    """Every strategy and repair of auto finds nothing, as when each is cut short by its time limit."""
    def nothing(*args, **kwargs):
        return None

    monkeypatch.setattr(auto_module, "_repair", nothing)
    monkeypatch.setattr(auto_module, "repair_to_budget", nothing)

    class Refusing:
        def __init__(self, entry):
            self.entry = entry

        def __getattr__(self, name):
            return getattr(self.entry, name)

        def fn(self, graph, budget_bytes, *args, **kwargs):
            raise InfeasibleBudgetError("refused", budget_bytes=budget_bytes, min_feasible_budget_bytes=None)

    monkeypatch.setattr(auto_module, "STRATEGIES",
                        {name: Refusing(entry) for name, entry in auto_module.STRATEGIES.items()})


def test_the_named_minimum_is_met_when_the_later_search_stops_above_it(graph, monkeypatch):
    minimum = _refused_minimum(graph)
    kept = auto_module._known_least_peak(graph, minimum)
    assert kept is not None and simulate(graph, kept).peak_memory_bytes <= minimum

    _no_search_reaches_a_schedule(monkeypatch)
    r = checkmate.solve(graph, minimum, strategy="auto", time_limit_s=5)
    assert_valid_schedule(graph, r.schedule, minimum)
    assert "least-peak" in r.status


def test_without_a_refusal_first_the_same_search_finds_nothing(graph, monkeypatch):
    # what the test above would see without the kept schedule
    minimum = _refused_minimum(graph)
    auto_module._LEAST_PEAK_SCHEDULES.clear()
    _no_search_reaches_a_schedule(monkeypatch)
    with pytest.raises(InfeasibleBudgetError):
        checkmate.solve(graph, minimum, strategy="auto", time_limit_s=5)


def test_a_kept_schedule_is_never_used_above_its_budget_or_on_another_graph(graph):
    minimum = _refused_minimum(graph)
    assert auto_module._known_least_peak(graph, minimum - 1) is None
    assert auto_module._known_least_peak(long_skip_unet(levels=3), 10 * minimum) is None
