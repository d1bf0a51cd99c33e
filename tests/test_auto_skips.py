"""``auto`` on graphs with long skips (a diffusion-style U-Net's concatenations): it must not refuse
a budget that a strategy it can run meets, and its minimum is the smallest of any strategy tried."""

from __future__ import annotations

import pytest

import checkmate
from checkmate.bounds import largest_working_set_bytes
from checkmate.errors import InfeasibleBudgetError
from checkmate.solvers import parse_budget
from checkmate.synthetic import training_graph

from cases import assert_valid_schedule


def diffusion_unet(levels: int = 4, blocks: int = 2, base_mem: int = 8 << 20, cost: float = 10.0):
    """A U-Net of residual blocks (norm, act, conv, norm, act, conv, add) whose every block output
    is concatenated into the decoder block of the same level, as diffusion models' U-Nets do."""
    fwd: list = []

    def add(name, c, mem, deps):
        fwd.append((name, c, mem, deps))
        return len(fwd) - 1

    prev = add("stem", cost, base_mem, [])
    skips, mem, width = [prev], base_mem, 1
    parts = ("norm1", "act1", "conv1", "norm2", "act2", "conv2")
    for level in range(levels):
        for b in range(blocks):
            start = prev
            for part in parts:
                prev = add(f"down{level}_{b}_{part}", cost * width / (1 if "conv" in part else 8), mem, [prev])
            prev = add(f"down{level}_{b}_add", cost * width / 10, mem, [start, prev])
            skips.append(prev)
        if level < levels - 1:
            prev = add(f"down{level}_pool", cost * width, mem // 2, [prev])
            mem //= 2
            width *= 2
            skips.append(prev)
    for part in ("mid1", "mid2", "mid3"):
        prev = add(part, cost * width, mem, [prev])
    for level in reversed(range(levels)):
        for b in range(blocks + 1):
            cat = add(f"up{level}_{b}_cat", cost * width / 10, 2 * mem, [prev, skips.pop()])
            prev = cat
            for part in parts:
                prev = add(f"up{level}_{b}_{part}", cost * width / (1 if "conv" in part else 8), mem, [prev])
            prev = add(f"up{level}_{b}_add", cost * width / 10, mem, [cat, prev])
        if level > 0:
            prev = add(f"up{level}_upsample", cost * width, 2 * mem, [prev])
            mem *= 2
            width //= 2
    add("loss", 0.1, 4, [prev])
    return training_graph(fwd, name="diffusion_unet")


@pytest.fixture(scope="module")
def unet():
    return diffusion_unet()


def test_auto_meets_a_budget_the_hierarchical_strategy_refuses(unet):
    assert unet.n > 300
    budget = parse_budget("50%", unet)
    with pytest.raises(InfeasibleBudgetError):
        checkmate.solve(unet, budget, strategy="hierarchical", time_limit_s=30)
    r = checkmate.solve(unet, budget, strategy="auto", time_limit_s=30)
    assert_valid_schedule(unet, r.schedule, budget)
    assert r.compute_cost <= checkmate.solve(unet, budget, strategy="chen_greedy_linearized").compute_cost


@pytest.mark.slow
def test_auto_repairs_a_schedule_at_a_budget_every_strategy_refuses(unet):
    budget = parse_budget("30%", unet)
    for strategy in ("hierarchical", "chen_greedy_linearized", "chen_greedy", "griewank_logn"):
        with pytest.raises(InfeasibleBudgetError):
            checkmate.solve(unet, budget, strategy=strategy, time_limit_s=30)
    # the repair from checkpoint-all takes 5-15 s here on two loaded cores: a limit that leaves it room
    r = checkmate.solve(unet, budget, strategy="auto", time_limit_s=60)
    assert_valid_schedule(unet, r.schedule, budget)
    assert "repaired" in r.status


@pytest.mark.slow
def test_auto_minimum_is_the_smallest_of_its_strategies(unet):
    budget = largest_working_set_bytes(unet) - 1        # below what any schedule needs
    minimums = []
    for strategy in ("hierarchical", "chen_greedy_linearized", "chen_greedy"):
        with pytest.raises(InfeasibleBudgetError) as info:
            checkmate.solve(unet, budget, strategy=strategy, time_limit_s=30)
        if info.value.min_feasible_budget_bytes is not None:
            minimums.append(info.value.min_feasible_budget_bytes)
    with pytest.raises(InfeasibleBudgetError) as info:
        checkmate.solve(unet, budget, strategy="auto", time_limit_s=30)
    found = info.value.min_feasible_budget_bytes
    assert found is not None and found <= min(minimums)
    r = checkmate.solve(unet, found, strategy="auto", time_limit_s=30)    # and that budget is met
    assert_valid_schedule(unet, r.schedule, found)
