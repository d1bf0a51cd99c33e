import numpy as np
import pytest
from hypothesis import given, settings

from cases import SMALL_CASES, assert_valid_schedule, random_dags, training_chain
from checkmate import GraphBuilder, InvalidScheduleError, Schedule, minimal_recompute, replay_plan, simulate
from checkmate.simulate import validate_schedule
from checkmate.solvers.baselines import checkpoint_all_schedule


def chain3():
    # f0 -> f1 -> f2 -> g2 -> g1 -> g0 ; g1 reads f1, g0 reads f0 (output); every value is 1 byte, cost 1
    return training_chain(3)


def test_checkpoint_all_by_hand():
    g = chain3()
    s = checkpoint_all_schedule(g)
    sim = simulate(g, s)
    # stage 3 holds f0, f1, f2 and computes g2: 4 bytes; nothing else ever needs more
    assert [st.memory_bytes for st in sim.timeline] == [1, 2, 3, 4, 4, 3]
    assert sim.peak_memory_bytes == 4 and sim.compute_cost == 6 and sim.recompute_count == 0
    assert s.plan == (("compute", 0), ("compute", 1), ("compute", 2), ("compute", 3), ("free", 2),
                      ("compute", 4), ("free", 1), ("free", 3), ("compute", 5), ("free", 0), ("free", 4))


def test_recompute_from_scratch_by_hand():
    g = chain3()
    S = np.zeros((6, 6), dtype=bool)
    for t in range(1, 6):
        S[t, t - 1] = True                   # keep only the previous stage's value
    s = Schedule.from_retain(g, S)
    R = s.recompute
    # stage 4 (g1) needs f1, recomputed from f0; stage 5 (g0) needs f0 again
    assert np.flatnonzero(R[4]).tolist() == [0, 1, 4]
    assert np.flatnonzero(R[5]).tolist() == [0, 5]
    sim = simulate(g, s)
    assert sim.compute_cost == 6 + 3 and sim.recompute_count == 3
    # stage 4: g2 held; f0 runs (2); f1 runs beside f0 (3), then f0 is freed; g1 runs: g2 + f1 + g1 = 3
    assert [st.memory_bytes for st in sim.timeline if st.stage == 4] == [2, 3, 3]
    assert sim.peak_memory_bytes == 3
    assert replay_plan(g, s.plan).peak_memory_bytes == 3


def test_unused_held_value_is_freed_at_stage_end_and_counts_until_then():
    b = GraphBuilder()
    a = b.add_node("a", 1, 100)
    x = b.add_node("x", 1, 1, [a])
    y = b.add_node("y", 1, 1, [x])
    z = b.add_node("z", 1, 1, [y, a], output=True)
    g = b.build()
    S = np.zeros((4, 4), dtype=bool)
    S[1, 0] = S[2, 0] = S[3, 0] = True       # a is held through stage 2 without being used there
    S[2, 1] = S[3, 2] = True
    s = Schedule.from_retain(g, S)
    sim = simulate(g, s)
    assert sim.valid
    stage2 = [st.memory_bytes for st in sim.timeline if st.stage == 2]
    assert stage2 == [100 + 1 + 1]           # a + x + y while y runs
    # dropping a after stage 2 would force recomputing it in stage 3: same rules, different S
    S2 = S.copy()
    S2[3, 0] = False
    s2 = Schedule.from_retain(g, S2)
    assert np.flatnonzero(s2.recompute[3]).tolist() == [0, 3]
    assert ("free", 0) in s2.plan[s2.plan.index(("compute", 2)):]


def test_outputs_stay_resident():
    g = training_chain(3)
    s = checkpoint_all_schedule(g)
    assert all(step != ("free", 5) for step in s.plan)
    bad = np.array(s.retain)
    b = GraphBuilder()
    o = b.add_node("o", 1, 5, output=True)
    b.add_node("p", 1, 1, [o])
    b.add_node("q", 1, 1, [1])
    g2 = b.build()
    S = np.zeros((3, 3), dtype=bool)
    S[1, 0] = True
    S[2, 1] = True
    sim = simulate(g2, Schedule.from_retain(g2, S))
    assert not sim.valid and any("output 0" in v for v in sim.violations)


def test_violations_are_reported():
    g = chain3()
    R = np.eye(6, dtype=bool)               # nothing held: inputs are missing
    S = np.zeros((6, 6), dtype=bool)
    sim = simulate(g, Schedule.from_matrices(g, R, S))
    assert not sim.valid and any("not resident" in v for v in sim.violations)
    with pytest.raises(InvalidScheduleError):
        validate_schedule(g, Schedule.from_matrices(g, R, S))
    R2 = minimal_recompute(g, S)
    R2[3, 3] = False                          # stage 3 must compute node 3
    assert any("does not compute node 3" in v for v in simulate(g, Schedule.from_matrices(g, R2, S)).violations)
    S3 = checkpoint_all_schedule(g).retain.copy()
    R3 = minimal_recompute(g, S3)
    R3[3, 0] = True                           # recomputing a resident value
    assert any("already resident" in v for v in simulate(g, Schedule.from_matrices(g, R3, S3)).violations)


def test_non_recomputable_node_recomputed_is_a_violation():
    b = GraphBuilder()
    a = b.add_node("seed", 1, 1, recomputable=False)
    x = b.add_node("x", 1, 1, [a])
    b.add_node("y", 1, 1, [x, a])
    g = b.build()
    S = np.zeros((3, 3), dtype=bool)
    S[1, 0] = True
    S[2, 1] = True
    sim = simulate(g, Schedule.from_retain(g, S))
    assert any("exactly once" in v for v in sim.violations)


@pytest.mark.parametrize("name", sorted(SMALL_CASES))
def test_checkpoint_all_on_small_cases(name):
    g = SMALL_CASES[name]()
    s = checkpoint_all_schedule(g)
    sim = assert_valid_schedule(g, s)
    assert sim.compute_cost == pytest.approx(g.total_cost)


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_minimal_recompute_is_valid_for_any_retention(g):
    rng = np.random.default_rng(g.n)
    S = np.tril(rng.random((g.n, g.n)) < 0.3, -1)
    # outputs must be held to the end for a valid schedule
    for i in np.flatnonzero(g.output):
        S[i + 1:, i] = True
    s = Schedule.from_retain(g, S)
    sim = simulate(g, s)
    assert sim.valid, sim.violations
    assert replay_plan(g, s.plan).peak_memory_bytes == sim.peak_memory_bytes
    # R is minimal: removing any recomputation (t != i) breaks validity
    for t, i in np.argwhere(s.recompute):
        if t == i:
            continue
        R = np.array(s.recompute)
        R[t, i] = False
        assert not simulate(g, Schedule.from_matrices(g, R, S)).valid
        break


def test_replay_plan_rejects_bad_plans():
    g = chain3()
    with pytest.raises(InvalidScheduleError, match="without its inputs"):
        replay_plan(g, [("compute", 1)])
    with pytest.raises(InvalidScheduleError, match="not resident"):
        replay_plan(g, [("free", 0)])
    with pytest.raises(InvalidScheduleError, match="never computes"):
        replay_plan(g, [("compute", 0)])
    with pytest.raises(InvalidScheduleError, match="unknown action"):
        replay_plan(g, [("launch", 0)])
