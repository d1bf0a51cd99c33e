"""Budgets as a share of the activation memory: ``"50% activations"`` is the bytes every schedule
holds (fixed bytes, outputs) plus that share of the checkpoint-all peak above them."""

from __future__ import annotations

import pytest

import checkmate
from checkmate.bounds import checkpoint_all_peak
from checkmate.budgets import activation_reference, budget_fraction, describe_fraction, is_relative_budget
from checkmate.errors import InfeasibleBudgetError, InvalidBudgetError
from checkmate.graph import GraphBuilder
from checkmate.solvers import parse_budget

from cases import assert_valid_schedule


def training_step(fixed_mem: int = 1000):
    """A 4-layer training chain with two gradient outputs (resident to the end) and fixed bytes."""
    b = GraphBuilder(name="step", fixed_mem=fixed_mem)
    f = [b.add_node(f"f{k}", cost=1.0, mem=100) for k in range(4)]
    for k in range(1, 4):
        b.add_edge(f[k - 1], f[k])
    loss = b.add_node("loss", cost=1.0, mem=4, backward=True, output=True)
    b.add_edge(f[3], loss)
    prev = loss
    for k in reversed(range(4)):
        g = b.add_node(f"g{k}", cost=1.0, mem=100, backward=True)
        b.add_edge(prev, g)
        b.add_edge(f[k], g)
        if k in (1, 2):
            w = b.add_node(f"w{k}", cost=1.0, mem=10, backward=True, output=True)
            b.add_edge(g, w)
        prev = g
    return b.build()


def test_activation_reference_is_the_peak_above_fixed_bytes_and_outputs():
    g = training_step()
    floor, activations = activation_reference(g)
    assert floor == 1000 + 4 + 10 + 10
    assert floor + activations == checkpoint_all_peak(g)
    assert parse_budget("100% activations", g) == checkpoint_all_peak(g)
    assert parse_budget("0.0001% activations", g) == floor
    assert parse_budget("50% activations", g) == floor + activations // 2


@pytest.mark.parametrize("text", ["50% activations", "50 % activation", "50% of activations",
                                  "50% of the activations", "50% activation memory", " 50%  ACTIVATIONS "])
def test_activation_budget_spellings(text):
    g = training_step()
    assert parse_budget(text, g) == parse_budget("50% activations", g)
    assert is_relative_budget(text)


@pytest.mark.parametrize("text", ["0% activations", "-5% activations", "50% weights", "activations",
                                  "50 activations"])
def test_bad_activation_budgets_are_refused(text):
    with pytest.raises(InvalidBudgetError):
        parse_budget(text, training_step())


def test_activation_budget_needs_a_graph():
    with pytest.raises(InvalidBudgetError, match="needs a graph"):
        parse_budget("50% activations")


def test_fraction_reads_bytes_in_the_budget_s_terms():
    g = training_step()
    floor, activations = activation_reference(g)
    assert budget_fraction(floor + activations // 4, g, "60% activations") == pytest.approx(25.0, abs=0.5)
    assert budget_fraction(checkpoint_all_peak(g) // 2, g, "60%") == pytest.approx(50.0, abs=0.1)
    assert budget_fraction(123, g, 123) is None
    assert describe_fraction(floor + activations, g, "10% activations") == ", 100.0% of the activations"
    assert describe_fraction(123, g, "2GiB") == ""


def test_solve_meets_an_activation_budget_or_names_the_minimum():
    g = training_step()
    budget = parse_budget("80% activations", g)
    r = checkmate.solve(g, "80% activations", strategy="checkmate_milp")
    assert r.budget_bytes == budget
    assert_valid_schedule(g, r.schedule, budget)
    assert r.compute_cost > g.total_cost          # below checkpoint-all: something is recomputed
    with pytest.raises(InfeasibleBudgetError) as info:
        checkmate.solve(g, "1% activations", strategy="checkmate_milp")
    assert info.value.min_feasible_budget_bytes > parse_budget("1% activations", g)
