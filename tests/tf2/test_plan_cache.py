"""The schedule cache and plan files: a solve is stored and reused only after its plan replays within
the budget; bad and foreign entries are ignored; it can be turned off; plans are checked against the
graph they are used on; RematModel reuses a schedule across instances and a save/load, and trains
with a plan file without solving."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import checkmate
import checkmate.solvers
from checkmate.errors import InvalidArgumentError
from checkmate.tf2 import plan_cache
from checkmate.tf2.plan_cache import PLAN_FIELD, ScheduleCache, solve_key, solve_or_reuse
from cases import assert_valid_schedule, training_chain


def _count_solves(monkeypatch) -> list:
    calls = []
    real = checkmate.solvers.solve

    def counting(*args, **kwargs):
        calls.append(args[1] if len(args) > 1 else kwargs.get("budget"))
        return real(*args, **kwargs)

    monkeypatch.setattr(checkmate.solvers, "solve", counting)
    return calls


def _budget(graph, fraction):
    return int(checkmate.solvers.checkpoint_all_peak(graph) * fraction)


def test_a_solve_is_stored_then_reused_after_a_replay_check(tmp_path, monkeypatch):
    graph = training_chain(8)
    budget = _budget(graph, 0.7)
    solves = _count_solves(monkeypatch)
    first = solve_or_reuse(graph, budget, strategy="checkmate_milp", schedule_cache=tmp_path, device="cpu-a")
    assert len(solves) == 1 and first.schedule is not None
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())[PLAN_FIELD]["key"]["device"] == "cpu-a"
    again = solve_or_reuse(graph, budget, strategy="checkmate_milp", schedule_cache=tmp_path, device="cpu-a")
    assert len(solves) == 1, "the second call solved again"
    assert again.schedule == first.schedule and again.compute_cost == first.compute_cost
    assert "schedule cache" in again.status and again.optimal == first.optimal
    assert_valid_schedule(graph, again.schedule, budget)
    # another budget, strategy or device is another key
    solve_or_reuse(graph, budget + 1, strategy="checkmate_milp", schedule_cache=tmp_path, device="cpu-a")
    solve_or_reuse(graph, budget, strategy="chen_greedy", schedule_cache=tmp_path, device="cpu-a")
    solve_or_reuse(graph, budget, strategy="checkmate_milp", schedule_cache=tmp_path, device="gpu-b")
    assert len(solves) == 4 and len(list(tmp_path.glob("*.json"))) == 4
    # another graph (one node's cost changed) too
    other = training_chain(8, cost=2.0)
    solve_or_reuse(other, budget, strategy="checkmate_milp", schedule_cache=tmp_path, device="cpu-a")
    assert len(solves) == 5


def test_bad_entries_are_ignored_and_replaced(tmp_path, monkeypatch):
    graph = training_chain(6)
    budget = _budget(graph, 0.8)
    key = solve_key(graph, budget, "checkmate_milp", None, {}, "cpu")
    cache = ScheduleCache(tmp_path)
    solves = _count_solves(monkeypatch)
    for garbage in ("{not json", json.dumps({"format": "checkmate-schedule/1"}), json.dumps([1, 2]), ""):
        cache.path(key).parent.mkdir(parents=True, exist_ok=True)
        cache.path(key).write_text(garbage)
        result = solve_or_reuse(graph, budget, strategy="checkmate_milp", schedule_cache=tmp_path, device="cpu")
        assert_valid_schedule(graph, result.schedule, budget)
        # the entry was rewritten with the fresh solve
        assert json.loads(cache.path(key).read_text())[PLAN_FIELD]["key"] == key
    assert len(solves) == 4
    # a stored plan whose cells were edited so that it no longer replays
    doc = json.loads(cache.path(key).read_text())
    doc["plan"] = doc["plan"][1:]
    cache.path(key).write_text(json.dumps(doc))
    assert cache.get(key, graph, budget) is None


def test_an_entry_that_no_longer_fits_is_solved_again(tmp_path, monkeypatch):
    graph = training_chain(8)
    loose, tight = _budget(graph, 1.0), _budget(graph, 0.6)
    cache = ScheduleCache(tmp_path)
    roomy = checkmate.solve(graph, loose, strategy="checkpoint_all")
    key = solve_key(graph, tight, "checkmate_milp", None, {}, "cpu")
    cache.put(key, graph, roomy)               # an entry for the tight budget that peaks above it
    assert cache.get(key, graph, tight) is None
    solves = _count_solves(monkeypatch)
    result = solve_or_reuse(graph, tight, strategy="checkmate_milp", schedule_cache=tmp_path, device="cpu")
    assert len(solves) == 1 and result.peak_memory_bytes <= tight
    assert cache.get(key, graph, tight).peak_memory_bytes <= tight


def test_an_unproven_entry_is_not_reused_for_a_longer_time_limit(tmp_path):
    graph = training_chain(6)
    budget = _budget(graph, 0.7)
    cache = ScheduleCache(tmp_path)
    result = checkmate.solve(graph, budget, strategy="checkmate_milp")
    key = solve_key(graph, budget, "auto", None, {}, "cpu")
    from dataclasses import replace

    cache.put(key, graph, replace(result, optimal=False), time_limit_s=5.0)
    assert cache.get(key, graph, budget, time_limit_s=5.0) is not None
    assert cache.get(key, graph, budget, time_limit_s=2.0) is not None
    assert cache.get(key, graph, budget, time_limit_s=60.0) is None
    # no limit asked is the solver's default limit: a longer solve than this one
    assert cache.get(key, graph, budget, time_limit_s=None) is None


def test_the_cache_can_be_turned_off_and_lives_beside_the_profile_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path / "root"))
    assert plan_cache.cache_dir() == tmp_path / "root" / "schedules"
    monkeypatch.delenv("CHECKMATE_CACHE_DIR")
    assert plan_cache.cache_dir() == plan_cache.Path.home() / ".cache" / "checkmate" / "schedules"
    for value, enabled in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("CHECKMATE_SCHEDULE_CACHE", value)
        assert plan_cache.cache_enabled() is enabled
    assert plan_cache.cache_enabled(True) and not plan_cache.cache_enabled(False)
    monkeypatch.setenv("CHECKMATE_SCHEDULE_CACHE", "0")
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path / "root"))
    graph = training_chain(5)
    solve_or_reuse(graph, _budget(graph, 1.0), strategy="checkpoint_all", device="cpu")
    assert not (tmp_path / "root").exists()


def test_an_unwritable_cache_does_not_fail_the_solve(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    graph = training_chain(5)
    result = solve_or_reuse(graph, _budget(graph, 1.0), strategy="checkpoint_all", schedule_cache=blocker / "x",
                            device="cpu")
    assert result.schedule is not None


def test_plan_files_are_checked_against_the_graph_and_budget(tmp_path):
    graph = training_chain(8)
    budget = _budget(graph, 0.7)
    result = checkmate.solve(graph, budget, strategy="checkmate_milp")
    path = tmp_path / "plan.json"
    plan_cache.save_plan(path, graph, result, batch_size=4)
    # a plan is a schedule document: the schedule readers take it
    assert checkmate.load_schedule(path, graph) == result.schedule
    used = solve_or_reuse(graph, budget, strategy="auto", plan=path)
    assert used.schedule == result.schedule and used.compute_cost == result.compute_cost and used.optimal
    with pytest.raises(InvalidArgumentError, match="another graph.*8 nodes"):
        solve_or_reuse(training_chain(4), budget, strategy="auto", plan=path)
    with pytest.raises(InvalidArgumentError, match="peaks at .* over its budget"):
        solve_or_reuse(graph, result.peak_memory_bytes - 1, strategy="auto", plan=path)
    # same structure, other costs: used, but the proof does not carry over
    costly = training_chain(8, cost=3.0)
    moved = solve_or_reuse(costly, budget, strategy="auto", plan=path)
    assert moved.schedule == result.schedule and not moved.optimal and moved.lower_bound is None
    (tmp_path / "not.json").write_text(json.dumps(result.schedule.to_dict()))
    with pytest.raises(InvalidArgumentError, match="not a plan file"):
        solve_or_reuse(graph, budget, strategy="auto", plan=tmp_path / "not.json")
    with pytest.raises(InvalidArgumentError, match="missing.json"):
        solve_or_reuse(graph, budget, strategy="auto", plan=tmp_path / "missing.json")


# ------------------------------------------------------------------------------------------ Keras
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

BATCH = 64
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def mlp(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16,))
    h = inputs
    for k in range(4):
        h = keras.layers.Dense(32, activation="relu", name=f"d{k}")(h)
    return keras.Model(inputs, keras.layers.Dense(5, name="head")(h), name="mlp")


def data(n=2 * BATCH):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 16)).astype("float32"), rng.integers(0, 5, (n,)).astype("int32")


def test_remat_model_reuses_its_schedule_across_instances_and_a_reload(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CHECKMATE_SCHEDULE_CACHE", "1")
    x, y = data()
    solves = _count_solves(monkeypatch)
    trainer = checkmate.tf2.RematModel(mlp(), budget="85%", strategy="checkmate_milp")
    trainer.compile(keras.optimizers.SGD(0.1), LOSS)
    trainer.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(solves) == 1
    assert list((tmp_path / "cache" / "schedules").glob("*.json"))
    twin = checkmate.tf2.RematModel(mlp(), budget="85%", strategy="checkmate_milp")
    twin.compile(keras.optimizers.SGD(0.1), LOSS)
    twin.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(solves) == 1, "an identical step was solved again"
    assert twin.compiled_step().schedule == trainer.compiled_step().schedule
    assert "schedule cache" in twin.compiled_step().result.status
    trainer.save(str(tmp_path / "t.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "t.keras"))
    loaded.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(solves) == 1, "a loaded model solved again"
    # turned off per model: solved
    off = checkmate.tf2.RematModel(mlp(), budget="85%", strategy="checkmate_milp",
                                   compile_options={"schedule_cache": False})
    off.compile(keras.optimizers.SGD(0.1), LOSS)
    off.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(solves) == 2


def test_remat_model_trains_with_a_plan_file_without_solving(tmp_path, monkeypatch):
    x, y = data()
    source = checkmate.tf2.RematModel(mlp(), budget="85%", strategy="checkmate_milp")
    source.compile(keras.optimizers.SGD(0.1), LOSS)
    source.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    step = source.compiled_step()
    path = tmp_path / "plan.json"
    plan_cache.save_plan(path, step.graph, step.result, predictions=False)
    solves = _count_solves(monkeypatch)

    model, plain = mlp(), mlp()
    trainer = checkmate.tf2.RematModel(model, budget="85%", plan=path)
    trainer.compile(keras.optimizers.SGD(0.1), LOSS, metrics=["accuracy"])
    history = trainer.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False).history
    assert not solves
    assert trainer.compiled_step().schedule == step.schedule
    assert "plan.json" in trainer.compiled_step().result.status
    plain.compile(keras.optimizers.SGD(0.1), LOSS, metrics=["accuracy"], jit_compile=False)
    want = plain.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False).history
    np.testing.assert_allclose(history["loss"], want["loss"], rtol=1e-4)
    # without predictions in the planned step, the metrics come from an inference pass after the update
    assert set(history) == {"loss", "accuracy"}
    assert trainer.get_config()["plan"] == os.fspath(path)

    wrong = checkmate.tf2.RematModel(mlp(), budget="85%", plan=path)
    wrong.compile(keras.optimizers.SGD(0.1), LOSS)
    with pytest.raises(InvalidArgumentError, match="another graph"):
        wrong.fit(*data(3 * BATCH), batch_size=2 * BATCH, epochs=1, verbose=0)
    with pytest.raises(InvalidArgumentError, match="not a plan file|missing"):
        checkmate.tf2.RematModel(mlp(), plan=tmp_path / "missing.json")


def test_fit_shows_one_status_line_while_it_plans(capsys):
    x, y = data()
    trainer = checkmate.tf2.RematModel(mlp(), budget="85%", strategy="checkmate_milp")
    trainer.compile(keras.optimizers.SGD(0.1), LOSS)
    trainer.fit(x, y, batch_size=BATCH, epochs=1, verbose=1)
    out = capsys.readouterr().out
    status = [line for line in out.splitlines() if line.startswith("checkmate:")]
    # not a terminal: the line as it starts and as it ends, nothing from the solver backends
    assert status[0].startswith("checkmate: planning mlp for batches of 64 | ")
    assert "mlp planned for batches of 64: overhead " in status[-1] and "checkmate_milp" in status[-1]
    assert "HiGHS" not in out and "Running" not in out
    quiet = checkmate.tf2.RematModel(mlp(), budget="85%", strategy="checkmate_milp")
    quiet.compile(keras.optimizers.SGD(0.1), LOSS)
    quiet.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert capsys.readouterr().out == ""


class _Terminal:
    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_the_status_line_is_rewritten_in_place_with_the_latest_message():
    import logging

    from checkmate.tf2.keras_model import CompileStatus

    terminal = _Terminal()
    log = logging.getLogger("checkmate.solvers")
    with CompileStatus("planning m", stream=terminal) as status:
        log.info("auto: chen_greedy fits at overhead 1.2350x (0.8 s)")
        log.info("hierarchical: 3.0 s, best overhead 1.0710x, bound 1.0454x")
        log.debug("not shown")
        status.done("m planned: overhead 1.071x")
    lines = terminal.text.split("\r")
    assert terminal.text.count("\n") == 1 and terminal.text.endswith("\n")
    assert "best overhead 1.0710x, bound 1.0454x" in lines[-2]
    assert lines[-1].startswith("checkmate: m planned: overhead 1.071x (")
    assert "not shown" not in terminal.text
    # a shorter line blanks what the longer one before it left
    assert len(lines[-1].rstrip("\n")) >= len(lines[-2])
    # the logger is as it was
    assert not any(isinstance(h, CompileStatus) for h in logging.getLogger("checkmate").handlers)
