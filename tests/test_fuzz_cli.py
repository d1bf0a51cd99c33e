"""Reliability of the command line and the API under malformed input: exit codes, one-line messages,
outputs that are never clobbered, bounded memory on large graphs and a prompt Ctrl-C.

The CLI runs in-process (``checkmate.cli.main``) except where a real process is the point: the
address-space limit and the interrupt.
"""

import csv
import json
import math
import os
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import checkmate
from cases import unet_like
from checkmate.analysis.sweep_data import CSV_COLUMNS
from checkmate.cli import main
from checkmate.errors import CheckmateError
from checkmate.graph import save_graph
from checkmate.synthetic import chain, resnet

EARLIER = '{"earlier": true}\n'
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])


def run_main(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err):
    assert code in (2, 3, 4), (code, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("checkmate"), err
    assert "internal error" not in err and "Traceback" not in err, err


def assert_no_temp_files(directory):
    assert not [p for p in Path(directory).rglob(".*.tmp")], list(Path(directory).iterdir())


# ------------------------------------------------------------------------------------ generators
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                      st.text(max_size=5))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                          max_leaves=12)


@st.composite
def malformed_graph_docs(draw):
    """Graph documents that are mostly right, with one or more fields broken."""
    n = draw(st.integers(0, 6))
    nodes = [{"id": i, "name": f"n{i}", "cost": draw(st.sampled_from([0, 1.0, 2.5])), "mem": 8,
              "backward": i >= n // 2} for i in range(n)]
    edges = [[i, i + 1] for i in range(n - 1)]
    doc = {"format": "checkmate-graph/1", "name": "fuzz", "nodes": nodes, "edges": edges}
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["node", "edge", "top"]))
        if where == "node" and nodes:
            node = draw(st.sampled_from(nodes))
            node[draw(st.sampled_from(["id", "cost", "mem", "backward", "name", "output"]))] = draw(json_value)
        elif where == "edge":
            edges.append(draw(st.one_of(json_value, st.lists(st.integers(-2, n + 2), min_size=2, max_size=2))))
        else:
            doc[draw(st.sampled_from(["nodes", "edges", "fixed_mem", "format", "name"]))] = draw(json_value)
    return doc


budget_texts = st.one_of(st.text(max_size=12), st.from_regex(r"-?[0-9]{0,25}(\.[0-9]{0,4})?(e-?[0-9]{1,6})?"
                                                             r"(B|KB|GiB|%|kb|x)?", fullmatch=True))


# ------------------------------------------------------------------------------------ fuzzed inputs
@FUZZ
@given(doc=st.one_of(malformed_graph_docs(), json_value))
def test_malformed_graphs_exit_cleanly_and_keep_earlier_output(capsys, doc):
    with tempfile.TemporaryDirectory() as d:
        graph_path, out = Path(d) / "g.json", Path(d) / "s.json"
        graph_path.write_text(json.dumps(doc))
        out.write_text(EARLIER)
        code, _, err = run_main(capsys, "solve", graph_path, "--budget", "90%", "--strategy", "chen_sqrtn",
                                "--out", out)
        if code != 0:
            assert_one_line_error(code, err)
            assert out.read_text() == EARLIER
        assert_no_temp_files(d)


@FUZZ
@given(raw=st.binary(max_size=64))
def test_undecodable_files_are_bad_input(capsys, raw):
    with tempfile.TemporaryDirectory() as d:
        g = Path(d) / "g.json"
        save_graph(chain(3), g)
        sched = Path(d) / "s.json"
        sched.write_bytes(b'{"format": "checkmate-schedule/1", "plan": "' + raw + b'"}')
        code, _, err = run_main(capsys, "plot", sched, "--graph", g, "--out", Path(d) / "p.png")
        assert_one_line_error(code, err)
        (Path(d) / "g2.json").write_bytes(raw + "é".encode("latin-1"))
        code, _, err = run_main(capsys, "solve", Path(d) / "g2.json", "--budget", "1GiB")
        assert_one_line_error(code, err)


@FUZZ
@given(text=budget_texts)
def test_any_budget_text_is_one_line_or_a_result(capsys, tmp_path, text):
    path = tmp_path / "g.json"
    if not path.exists():
        save_graph(unet_like(), path)
    code, out, err = run_main(capsys, "solve", path, f"--budget={text}", "--strategy", "chen_sqrtn", "--json")
    if code == 0:
        assert json.loads(out)["feasible"] is True
    else:
        assert_one_line_error(code, err)


@st.composite
def mutated_plans(draw, plan, n):
    plan = [list(step) for step in plan]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["insert", "delete", "swap", "rename"]))
        k = draw(st.integers(0, max(len(plan) - 1, 0)))
        if kind == "insert":
            plan.insert(k, [draw(st.sampled_from(["compute", "free", "load", ""])), draw(st.integers(-1, n + 1))])
        elif kind == "delete" and plan:
            plan.pop(k)
        elif kind == "swap" and len(plan) > 1:
            j = draw(st.integers(0, len(plan) - 1))
            plan[k], plan[j] = plan[j], plan[k]
        elif plan:
            plan[k] = [plan[k][0], draw(st.integers(-1, n + 1))]
    return plan


def _solved_schedule(tmp: Path):
    g = chain(4)
    save_graph(g, tmp / "g.json")
    r = checkmate.solve(g, "100%", strategy="chen_sqrtn")
    checkmate.save_schedule(r.schedule, tmp / "s.json")
    return g, json.loads((tmp / "s.json").read_text())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_plot_replays_the_plan_and_checks_node_ids(capsys, data):
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        g, doc = _solved_schedule(tmp)
        plan = data.draw(mutated_plans(doc["plan"], g.n))
        ids = data.draw(st.one_of(st.just(doc["node_ids"]), st.permutations(doc["node_ids"]).map(list)))
        (tmp / "bad.json").write_text(json.dumps({**doc, "plan": plan, "node_ids": ids}))
        out = tmp / "p.png"
        out.write_text(EARLIER)
        code, _, err = run_main(capsys, "plot", tmp / "bad.json", "--graph", tmp / "g.json", "--out", out)
        try:
            replay = checkmate.replay_plan(g, [tuple(step) for step in plan])
        except CheckmateError:
            replay = None
        if replay is None or ids != doc["node_ids"]:
            assert_one_line_error(code, err)
            assert code == 2
            assert out.read_text() == EARLIER
        assert_no_temp_files(d)


# ------------------------------------------------------------------------------------ output paths
def test_outputs_follow_symlinks_and_refuse_what_they_would_destroy(tmp_path, capsys):
    g = tmp_path / "g.json"
    save_graph(unet_like(), g)
    target = tmp_path / "target.json"
    target.write_text(EARLIER)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert run_main(capsys, "solve", g, "--budget", "90%", "--strategy", "chen_sqrtn", "--out", link)[0] == 0
    assert link.is_symlink() and json.loads(target.read_text())["format"] == "checkmate-schedule/1"

    readonly = tmp_path / "ro.json"
    readonly.write_text(EARLIER)
    readonly.chmod(0o444)
    plain = tmp_path / "plain"
    plain.write_text(EARLIER)
    directory = tmp_path / "dir.json"
    directory.mkdir()
    for out in (readonly, directory, plain / "under.json", "/dev/null"):
        code, _, err = run_main(capsys, "solve", g, "--budget", "90%", "--strategy", "chen_sqrtn", "--out", out)
        assert_one_line_error(code, err)
        assert code == 2
    assert readonly.read_text() == EARLIER and stat.S_IMODE(readonly.stat().st_mode) == 0o444
    assert plain.read_text() == EARLIER and directory.is_dir() and not list(directory.iterdir())
    code, _, err = run_main(capsys, "plot", target, "--graph", g, "--out", tmp_path / "x.xyz")
    assert_one_line_error(code, err)
    assert_no_temp_files(tmp_path)


def test_replacing_a_file_keeps_its_permissions(tmp_path, capsys):
    g = tmp_path / "g.json"
    save_graph(unet_like(), g)
    out = tmp_path / "s.json"
    out.write_text(EARLIER)
    out.chmod(0o640)
    assert run_main(capsys, "solve", g, "--budget", "90%", "--strategy", "chen_sqrtn", "--out", out)[0] == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


def test_a_failed_sweep_keeps_the_earlier_sweep(tmp_path, capsys):
    g = tmp_path / "g.json"
    save_graph(unet_like(), g)
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.csv").write_text("earlier csv\n")
    (out / "sweep.png").mkdir()  # an output that cannot be written
    code, _, err = run_main(capsys, "sweep", g, "--out", out, "--strategies", "chen_sqrtn", "--budgets", "3",
                            "--executor", "serial")
    assert_one_line_error(code, err)
    assert (out / "sweep.csv").read_text() == "earlier csv\n" and not (out / "sweep.json").exists()
    assert_no_temp_files(tmp_path)


# ------------------------------------------------------------------------------------ wrong answers
def _zero_cost_graph_file(tmp_path) -> Path:
    nodes = [{"id": i, "name": f"n{i}", "cost": 0, "mem": 10, "backward": i >= 3} for i in range(6)]
    edges = [[i, i + 1] for i in range(5)] + [[2, 3], [1, 4], [0, 5]]
    path = tmp_path / "zero.json"
    path.write_text(json.dumps({"format": "checkmate-graph/1", "name": "zero", "nodes": nodes, "edges": edges}))
    return path


@pytest.mark.parametrize("strategy", ["chen_sqrtn", "checkpoint_all", "checkmate_milp", "auto"])
def test_a_graph_that_costs_nothing_is_solved(tmp_path, capsys, strategy):
    path = _zero_cost_graph_file(tmp_path)
    code, out, err = run_main(capsys, "solve", path, "--budget", "100%", "--strategy", strategy)
    assert code == 0, err
    assert "1.000x" in out


def test_a_sweep_of_a_graph_that_costs_nothing_reports_what_its_csv_says(tmp_path, capsys):
    path = _zero_cost_graph_file(tmp_path)
    code, out, err = run_main(capsys, "sweep", path, "--out", tmp_path / "sw", "--strategies", "checkpoint_all",
                              "--budgets", "3", "--executor", "serial")
    assert code == 0, err
    assert "feasible from" in out
    rows = list(csv.DictReader(open(tmp_path / "sw" / "sweep.csv")))
    assert any(r["feasible"] == "True" for r in rows)


def test_huge_budgets_are_bad_input(tmp_path, capsys):
    g = tmp_path / "g.json"
    save_graph(unet_like(), g)
    for budget in ("1e400", "9" * 500, "1e99999999", "5e-99999"):
        code, _, err = run_main(capsys, "solve", g, "--budget", budget, "--strategy", "chen_sqrtn")
        assert_one_line_error(code, err)
        assert code == 2


# ------------------------------------------------------------------------------------ the API
def test_the_api_raises_checkmate_errors_only():
    g = unet_like()
    bad_calls = [
        lambda: checkmate.solve(None, "50%"),
        lambda: checkmate.solve("graph.json", "50%"),
        lambda: checkmate.solve(g, 10**400),
        lambda: checkmate.solve(g, float("inf")),
        lambda: checkmate.solve(g, "50%", strategy=None),
        lambda: checkmate.simulate(g, None),
        lambda: checkmate.simulate(None, None),
        lambda: checkmate.replay_plan(g, None),
        lambda: checkmate.replay_plan(g, [("compute", 10**30)]),
        lambda: checkmate.solve(g, "50%", time_limit_s=-5),
        lambda: checkmate.solve(g, "50%", time_limit_s=math.nan),
        lambda: checkmate.solve(g, "50%", time_limit_s=math.inf),
        lambda: checkmate.solve(g, "50%", mip_gap=-1),
        lambda: checkmate.solve(g, "50%", mip_gap=math.nan),
        lambda: checkmate.solve(g, "50%", threads=0),
        lambda: checkmate.solve(g, "50%", no_such_option=1),
    ]
    for call in bad_calls:
        with pytest.raises(CheckmateError):
            call()


def test_numpy_integer_budgets_are_accepted():
    g = unet_like()
    peak = checkmate.solvers.checkpoint_all_peak(g)
    for budget in (np.int64(peak), np.int32(min(peak, 2**31 - 1)) if peak < 2**31 else np.int64(peak),
                   np.uint64(peak)):
        r = checkmate.solve(g, budget, strategy="checkpoint_all")
        assert r.budget_bytes == int(budget)


# ------------------------------------------------------------------------------------ real processes
def _cli_command():
    return [sys.executable, "-m", "checkmate"]


def _env():
    env = dict(os.environ)
    root = str(Path(checkmate.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


ADDRESS_SPACE_LIMIT_BYTES = 6 * 2**30  # a few GiB: the flat model of this chain would need tens


def _limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT_BYTES, ADDRESS_SPACE_LIMIT_BYTES))


@pytest.mark.slow
def test_a_large_graph_hands_over_or_refuses_within_bounded_memory(tmp_path):
    path = tmp_path / "chain.json"
    save_graph(chain(2500), path)  # 5,002 nodes with its backward pass
    start = time.monotonic()
    proc = subprocess.run([*_cli_command(), "solve", str(path), "--budget", "30%", "--strategy", "checkmate_milp",
                           "--time-limit", "5"], capture_output=True, text=True, timeout=300, env=_env(),
                          preexec_fn=_limit_address_space)
    assert proc.returncode in (0, 4), proc.stderr
    if proc.returncode == 0:
        assert "hierarchical" in proc.stdout
    else:
        assert_one_line_error(proc.returncode, proc.stderr)
    assert time.monotonic() - start < 240


INTERRUPT_DEADLINE_S = 8.0  # the CLI's grace period is 2 s; the rest is process start and worker teardown


@pytest.mark.parametrize("executor", ["process", "serial"])
def test_ctrl_c_stops_a_sweep_promptly_and_keeps_complete_rows(tmp_path, executor):
    path = tmp_path / "g.json"
    save_graph(resnet(40), path)
    out = tmp_path / "sweep"
    proc = subprocess.Popen([*_cli_command(), "sweep", str(path), "--out", str(out), "--strategies",
                             "chen_sqrtn,checkmate_milp", "--time-limit", "60", "--executor", executor,
                             "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    time.sleep(12)  # imports done, the frontier probes and the first MILP solves under way
    assert proc.poll() is None, proc.communicate()
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < INTERRUPT_DEADLINE_S
    assert proc.returncode == 130
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("checkmate: interrupted"), err
    assert not (out / "sweep.csv").exists()
    partial = out / "sweep.partial.csv"
    if partial.exists():
        rows = list(csv.reader(open(partial)))
        assert rows[0] == list(CSV_COLUMNS)
        assert all(len(r) == len(CSV_COLUMNS) and r[CSV_COLUMNS.index("feasible")] in ("True", "False", "")
                   for r in rows[1:])
    assert_no_temp_files(tmp_path)


@pytest.mark.slow
def test_the_lp_roundings_minimum_is_a_budget_at_which_it_succeeds(capsys):
    example = Path(checkmate.__file__).parent / "data" / "examples" / "unet_train.json"
    code, out, err = run_main(capsys, "solve", example, "--budget", "469762047", "--strategy",
                              "checkmate_lp_rounding", "--json")
    assert code == 3, err
    minimum = json.loads(out)["min_feasible_budget_bytes"]
    assert minimum is not None
    code, _, err = run_main(capsys, "solve", example, "--budget", minimum, "--strategy", "checkmate_lp_rounding")
    assert code == 0, err


# ------------------------------------------------------------------------------------ results serialize
def test_json_of_an_unproven_auto_result_on_a_large_graph(tmp_path, capsys):
    path = tmp_path / "g.json"
    save_graph(chain(100), path)  # 202 nodes: above the exact MILP's range, so auto is hierarchical
    out = tmp_path / "s.json"
    code, text, err = run_main(capsys, "solve", path, "--budget", "30%", "--json", "--time-limit", "30",
                               "--out", out)
    assert code == 0, err
    doc = json.loads(text)
    assert doc["feasible"] is True and isinstance(doc["optimal"], bool)
    assert isinstance(doc["lower_bound"], float) and isinstance(doc["gap"], float)
    assert json.loads(out.read_text())["format"] == "checkmate-schedule/1"


def test_api_results_hold_plain_python_values():
    g = chain(100)
    for strategy in ("hierarchical", "auto", "chen_greedy"):
        r = checkmate.solve(g, "30%", strategy=strategy, time_limit_s=30)
        assert type(r.optimal) is bool and type(r.compute_cost) is float and type(r.peak_memory_bytes) is int
        assert r.lower_bound is None or type(r.lower_bound) is float
        assert r.gap is None or type(r.gap) is float
        json.dumps(r.to_json_dict(), allow_nan=False)


def test_a_result_that_cannot_be_shown_keeps_the_earlier_schedule(tmp_path, capsys, monkeypatch):
    path = tmp_path / "g.json"
    save_graph(unet_like(), path)
    out = tmp_path / "s.json"
    out.write_text(EARLIER)

    def broken(self):
        raise TypeError("cannot serialize")

    monkeypatch.setattr(checkmate.solvers.SolveResult, "to_json_dict", broken)
    code, _, _ = run_main(capsys, "solve", path, "--budget", "90%", "--strategy", "chen_sqrtn", "--json",
                          "--out", out)
    assert code != 0
    assert out.read_text() == EARLIER
    assert_no_temp_files(tmp_path)


def test_a_sweep_of_hierarchical_with_a_cache(tmp_path, capsys):
    path = tmp_path / "g.json"
    save_graph(chain(20), path)
    args = ("sweep", path, "--out", tmp_path / "sw", "--strategies", "hierarchical,chen_greedy", "--budgets", "3",
            "--executor", "serial", "--cache-dir", tmp_path / "cache", "--time-limit", "20")
    for _ in range(2):  # the second run reads every row back from the cache
        code, _, err = run_main(capsys, *args)
        assert code == 0, err
        rows = list(csv.DictReader(open(tmp_path / "sw" / "sweep.csv")))
        assert {r["strategy"] for r in rows} == {"hierarchical", "chen_greedy"}
    meta = json.loads((tmp_path / "sw" / "sweep.json").read_text())["meta"]
    assert meta["solves"] == 0 and meta["cached_solves"] > 0


# ------------------------------------------------------------------------------------ time limits
def test_a_baseline_on_a_large_graph_stops_at_its_time_limit():
    from checkmate.errors import TimeLimitError

    g = chain(1500)  # 3,002 nodes: recomputing everything is millions of steps to build and replay
    start = time.monotonic()
    with pytest.raises(TimeLimitError):
        checkmate.solve(g, "30%", strategy="checkpoint_last_node", time_limit_s=0.5)
    assert time.monotonic() - start < 5


def test_a_family_search_cut_short_returns_the_best_member_found():
    from checkmate._deadline import deadline_scope
    from checkmate.solvers.baselines import _search_family

    calls = []

    def evaluate(index):
        calls.append(index)
        if len(calls) > 8:
            from checkmate.errors import TimeLimitError

            raise TimeLimitError("time limit")
        return float(index), 100 - index, index, index  # cost grows, peak shrinks

    with deadline_scope(time.perf_counter() + 60):
        # sampled 0, 2, 3, 5, 7, 8, 10 (the first to fit), bisected 9, then cut short at the next sample
        assert _search_family(40, evaluate, 90, "s", "member") == (10, 10)
    calls.clear()
    with pytest.raises(CheckmateError):  # nothing fitting found before the limit: no answer
        _search_family(40, evaluate, 10, "s", "member")


def test_auto_whose_strategies_ran_out_of_time_does_not_call_the_budget_infeasible(monkeypatch):
    """Only checkpoint-all answered (over the budget) and every other strategy ran out of time: the
    budget may well fit, so the answer is a time-limit error naming checkpoint-all's peak as the
    smallest budget known to fit, not an infeasible budget."""
    from types import SimpleNamespace

    from checkmate.errors import InfeasibleBudgetError, TimeLimitError
    from checkmate.solvers import auto as auto_module

    def out_of_time(*args, **kwargs):
        raise TimeLimitError("time limit")

    patched = {name: (spec if name == "checkpoint_all" else SimpleNamespace(fn=out_of_time))
               for name, spec in auto_module.STRATEGIES.items()}
    monkeypatch.setattr(auto_module, "STRATEGIES", patched)
    g = chain(20)
    # auto repairs checkpoint-all's schedule down to the budget when it has the time
    r = checkmate.solve(g, "50%", strategy="auto", time_limit_s=5)
    assert r.peak_memory_bytes <= checkmate.solvers.parse_budget("50%", g) and "repaired" in r.status
    monkeypatch.setattr(auto_module, "_repair", lambda *args, **kwargs: None)    # when it has not
    with pytest.raises(TimeLimitError, match="smallest budget known to fit is") as info:
        checkmate.solve(g, "50%", strategy="auto", time_limit_s=5)
    assert not isinstance(info.value, InfeasibleBudgetError)
    assert str(checkmate.simulate(g, checkmate.solve(g, "100%", strategy="checkpoint_all").schedule)
               .peak_memory_bytes) in str(info.value)


@pytest.mark.slow
def test_a_ten_thousand_node_chain_answers_within_its_time_limit(tmp_path):
    path = tmp_path / "chain.json"
    save_graph(chain(5000), path)  # 10,002 nodes
    start = time.monotonic()
    proc = subprocess.run([*_cli_command(), "solve", str(path), "--budget", "30%", "--time-limit", "10"],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert time.monotonic() - start < 60
    assert proc.returncode in (0, 4), proc.stderr
    if proc.returncode:
        assert_one_line_error(proc.returncode, "\n".join(line for line in proc.stderr.splitlines()
                                                         if not line.startswith("checkmate: auto:")))


# ------------------------------------------------------------------------------------ outputs and inputs
def test_an_output_that_is_the_input_is_refused(tmp_path, capsys):
    g = tmp_path / "g.json"
    save_graph(unet_like(), g)
    original = g.read_text()
    link = tmp_path / "link.json"
    link.symlink_to(g)
    hard = tmp_path / "hard.json"
    os.link(g, hard)
    for out in (g, link, hard, tmp_path / "." / "g.json"):
        code, _, err = run_main(capsys, "solve", g, "--budget", "90%", "--strategy", "chen_sqrtn", "--out", out)
        assert_one_line_error(code, err)
        assert code == 2 and "input" in err
    code, _, err = run_main(capsys, "solve", link, "--budget", "90%", "--strategy", "chen_sqrtn", "--out", g)
    assert code == 2
    r = checkmate.solve(unet_like(), "90%", strategy="chen_sqrtn")
    checkmate.save_schedule(r.schedule, tmp_path / "s.json")
    for out in (tmp_path / "s.json", g):
        code, _, err = run_main(capsys, "plot", tmp_path / "s.json", "--graph", g, "--out", out)
        assert code == 2, err
    assert g.read_text() == original
    assert_no_temp_files(tmp_path)


@pytest.mark.parametrize("args", [
    ("solve", "{g}", "--budget", "90%", "--out", ""),
    ("solve", "", "--budget", "90%"),
    ("sweep", "{g}", "--out", ""),
    ("sweep", "{g}", "--out", "{d}/sw", "--cache-dir", ""),
    ("plot", "{g}", "--graph", "{g}", "--out", ""),
])
def test_empty_paths_are_bad_input(tmp_path, capsys, args):
    g = tmp_path / "g.json"
    save_graph(unet_like(), g)
    before = sorted(os.listdir(tmp_path))
    try:
        code = main([a.format(g=g, d=tmp_path) for a in args])
    except SystemExit as exc:  # a usage error, as argparse reports it
        code = exc.code
    err = capsys.readouterr().err
    assert_one_line_error(code, err)
    assert code == 2
    assert sorted(os.listdir(tmp_path)) == before


def test_an_empty_cache_directory_is_refused_by_the_api():
    from checkmate.analysis.point_cache import PointCache
    from checkmate.errors import OutputPathError

    with pytest.raises(OutputPathError):
        PointCache("")


# ------------------------------------------------------------------------------------ caches
def _sweep_cache_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.json"))


BAD_RESULTS = [[], {}, "x", None, {"strategy": "chen_sqrtn"}, "nested", "strategy", "budget", "cost", "feasible",
               "types", "peak"]


def _corrupt(doc: dict, how: str) -> dict:
    row = dict(doc["result"])
    if how == "strategy":
        row["strategy"] = "no_such_strategy"
    elif how == "budget":
        row["budget_bytes"] = -1
    elif how == "cost":
        row["compute_cost"] = float("nan")
    elif how == "feasible":
        row["feasible"] = "yes"
    elif how == "types":
        row.update(optimal=1, solve_seconds="fast", status=3)
    elif how == "peak":
        row["peak_memory_bytes"] = 1.5
    else:
        return {**doc, "result": how}
    return {**doc, "result": row}


@pytest.mark.parametrize("how", BAD_RESULTS, ids=[str(b) for b in BAD_RESULTS])
def test_a_cache_entry_with_a_malformed_result_is_a_miss(tmp_path, capsys, how):
    g = tmp_path / "g.json"
    save_graph(unet_like(), g)
    cache = tmp_path / "cache"
    args = ("sweep", g, "--out", tmp_path / "sw", "--strategies", "chen_sqrtn,chen_greedy", "--budgets", "3",
            "--executor", "serial", "--cache-dir", cache)
    assert run_main(capsys, *args)[0] == 0
    good = (tmp_path / "sw" / "sweep.csv").read_text()
    for path in _sweep_cache_files(cache):
        doc = json.loads(path.read_text())
        path.write_text(_deep_json(doc) if how == "nested" else json.dumps(_corrupt(doc, how)))
    code, out, err = run_main(capsys, *args)
    assert code == 0, err
    assert _without_seconds((tmp_path / "sw" / "sweep.csv").read_text()) == _without_seconds(good)
    meta = json.loads((tmp_path / "sw" / "sweep.json").read_text())["meta"]
    assert meta["cached_solves"] == 0  # every entry was read as a miss and solved again


def _deep_json(doc: dict) -> str:
    # json.dumps itself recurses: write the nested list by hand
    row = dict(doc["result"])
    row["compute_cost"] = "__DEEP__"
    text = json.dumps({**doc, "result": row})
    return text.replace('"__DEEP__"', "[" * 5000 + "]" * 5000)


def _without_seconds(csv_text: str) -> list[dict]:
    rows = list(csv.DictReader(csv_text.splitlines()))
    for row in rows:
        row.pop("solve_seconds")
    return rows


def test_csv_rows_from_a_cache_are_the_solved_ones(tmp_path, capsys):
    g = tmp_path / "g.json"
    save_graph(unet_like(), g)
    cache = tmp_path / "cache"
    args = ("sweep", g, "--out", tmp_path / "sw", "--strategies", "chen_sqrtn,chen_greedy", "--budgets", "3",
            "--executor", "serial", "--cache-dir", cache)
    assert run_main(capsys, *args)[0] == 0
    first = list(csv.DictReader(open(tmp_path / "sw" / "sweep.csv")))
    assert run_main(capsys, *args)[0] == 0
    again = list(csv.DictReader(open(tmp_path / "sw" / "sweep.csv")))
    assert json.loads((tmp_path / "sw" / "sweep.json").read_text())["meta"]["solves"] == 0
    assert first == again


@pytest.mark.parametrize("blocker", ["directory", "loop"])
def test_an_unwritable_cache_entry_is_a_warning_and_the_sweep_is_written(tmp_path, capsys, blocker):
    from checkmate.analysis.point_cache import PointCache
    from checkmate.analysis.sweep import _Task, payload_digest, sweep_point_key

    g = unet_like()
    path = tmp_path / "g.json"
    save_graph(g, path)
    cache_dir = tmp_path / "cache"
    cache = PointCache(cache_dir)
    # the entry of the chen_sqrtn probe (budget-unaware: solved once, at a budget nothing exceeds)
    probe_budget = max(checkmate.solvers.checkpoint_all_peak(g), checkmate.bounds.largest_working_set_bytes(g)) * 1024
    key = sweep_point_key(payload_digest(g.to_dict()), _Task("chen_sqrtn", probe_budget, None, None, None, None))
    entry = cache._path(json.dumps(key, sort_keys=True, separators=(",", ":"), default=str))
    cache_dir.mkdir()
    if blocker == "directory":
        entry.mkdir()
    else:
        entry.symlink_to(entry)
    code, out, err = run_main(capsys, "sweep", path, "--out", tmp_path / "sw", "--strategies", "chen_sqrtn",
                              "--budgets", "3", "--executor", "serial", "--cache-dir", cache_dir)
    assert code == 0, err
    assert "warning" in err and "cache" in err
    assert len(list(csv.DictReader(open(tmp_path / "sw" / "sweep.csv")))) == 3
    assert_no_temp_files(tmp_path)


def test_a_cache_write_failure_is_not_raised_by_the_api(tmp_path):
    from checkmate.analysis.point_cache import PointCache

    cache = PointCache(tmp_path / "c")
    assert cache.put({"k": 1}, {"v": np.float64(1.5), "ok": np.bool_(True)}) is True
    assert cache.get({"k": 1}) == {"v": 1.5, "ok": True}
    blocked = cache._path(json.dumps({"k": 2}, sort_keys=True, separators=(",", ":")))
    blocked.mkdir()
    assert cache.put({"k": 2}, {"v": 1}) is False and cache.write_failures == 1
    assert cache.get({"k": 1}, valid=lambda r: r["v"] > 2) is None  # refused by the caller's check
    assert cache.get({"k": 1}, valid=lambda r: r["missing"]) is None  # a check that raises: a miss
    for malformed in ([], {}, "x", 3, None):  # whatever the caller's check, never a result
        cache.put({"k": 3}, {"v": 1})
        entry = cache._path(json.dumps({"k": 3}, sort_keys=True, separators=(",", ":")))
        doc = json.loads(entry.read_text())
        entry.write_text(json.dumps({**doc, "result": malformed}))
        assert cache.get({"k": 3}) is None
        assert cache.get_or_compute({"k": 3}, lambda: {"v": 2}) == {"v": 2}


# ------------------------------------------------------------------------------------ strategies
def test_auto_solves_a_graph_of_backward_nodes_only(tmp_path, capsys):
    nodes = [{"id": i, "name": f"n{i}", "cost": 1.0, "mem": 10, "backward": True} for i in range(5)]
    path = tmp_path / "bwd.json"
    path.write_text(json.dumps({"format": "checkmate-graph/1", "name": "bwd", "nodes": nodes,
                                "edges": [[i, i + 1] for i in range(4)]}))
    for strategy in ("auto", "checkpoint_all", "checkmate_milp"):
        code, out, err = run_main(capsys, "solve", path, "--budget", "100%", "--strategy", strategy, "--json")
        assert code == 0, (strategy, err)
        assert json.loads(out)["feasible"] is True


# ------------------------------------------------------------------------------------ API argument types
def test_api_argument_types_raise_checkmate_errors(tmp_path):
    from checkmate.analysis.sweep import sweep

    g = unet_like()
    bad_calls = [
        lambda: checkmate.load_graph(None),
        lambda: checkmate.load_graph(123),
        lambda: checkmate.load_graph(""),
        lambda: checkmate.load_schedule(None),
        lambda: checkmate.save_schedule(None, tmp_path / "s.json"),
        lambda: checkmate.save_graph(None, tmp_path / "g.json"),
        lambda: checkmate.solve(g, "90%", seed="x"),
        lambda: checkmate.solve(g, "90%", seed=1.5),
        lambda: checkmate.solve(g, "90%", race="yes"),
        lambda: checkmate.solve(g, "90%", progress=5),
        lambda: checkmate.solve(g, "90%", verbose="loud"),
        lambda: checkmate.solve(g, "90%", working_set_fraction="x"),
        lambda: checkmate.solve(g, 1.5),
        lambda: checkmate.solve(g, "1.5"),
        lambda: checkmate.solve(g, "7.5B"),
        lambda: checkmate.save_graph(g, None),
        lambda: checkmate.save_schedule(checkmate.solve(g, "90%", strategy="chen_sqrtn").schedule, 5),
        lambda: sweep("graph.json", ["chen_sqrtn"], executor="serial"),
        lambda: sweep(g, "chen_sqrtn", executor="serial"),
        lambda: sweep(g, ["chen_sqrtn"], budgets="3", executor="serial"),
        lambda: sweep(g, ["chen_sqrtn"], budgets=2.5, executor="serial"),
        lambda: sweep(g, ["chen_sqrtn"], workers="2"),
    ]
    for call in bad_calls:
        with pytest.raises(CheckmateError):
            call()
    assert not list(tmp_path.iterdir())
    assert checkmate.solve(g, "90%", strategy="chen_sqrtn", seed=np.int64(3), race=np.bool_(False)).feasible


def test_fractional_byte_budgets_are_bad_input(tmp_path, capsys):
    g = tmp_path / "g.json"
    save_graph(unet_like(), g)
    code, _, err = run_main(capsys, "solve", g, "--budget", "1000000.5", "--strategy", "chen_sqrtn")
    assert_one_line_error(code, err)
    assert code == 2 and "whole" in err


# ------------------------------------------------------------------------------------ signals and pipes
def test_a_reader_that_goes_away_ends_the_command_quietly():
    proc = subprocess.Popen([*_cli_command(), "strategies"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env())
    proc.stdout.close()  # as `checkmate strategies | true` does
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err == b""


def test_removing_temporaries_of_a_write_under_way(tmp_path):
    from checkmate.io import atomic_output, remove_temporaries

    target = tmp_path / "out.json"
    target.write_text(EARLIER)
    with pytest.raises(RuntimeError):
        with atomic_output(target) as tmp:
            tmp.write_text("half")
            remove_temporaries()  # what a process ended from outside does before it exits
            assert not tmp.exists()
            raise RuntimeError
    assert target.read_text() == EARLIER
    assert_no_temp_files(tmp_path)


def _session_processes(sid: int) -> list[str]:
    """Live processes (zombies excluded) of session ``sid``: '<pid> <command line>' for each."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] not in ("Z", "X") and int(fields[3]) == sid:
            found.append(f"{entry} {cmdline}")
    return found


def _wait_for_children(sid: int, count: int, timeout_s: float) -> list[str]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        procs = _session_processes(sid)
        if len(procs) >= count:
            return procs
        time.sleep(0.2)
    return _session_processes(sid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts processes through /proc")
def test_sigterm_to_a_racing_milp_solve_leaves_nothing(tmp_path):
    path = tmp_path / "g.json"
    save_graph(resnet(40), path)
    proc = subprocess.Popen([*_cli_command(), "solve", str(path), "--budget", "40%", "--strategy", "checkmate_milp",
                             "--time-limit", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), start_new_session=True)
    sid = proc.pid
    # the solve and its CP-SAT child
    procs = _wait_for_children(sid, 2, 60)
    assert proc.poll() is None, proc.communicate()
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("checkmate: checkmate_milp")]
    assert lines[-1] == "checkmate: terminated", err
    assert sum(1 for line in err.splitlines() if "terminated" in line) == 1, err
    time.sleep(max(0.0, 3.0 - (time.monotonic() - sent)))
    assert _session_processes(sid) == [], (procs, _session_processes(sid))
    assert_no_temp_files(tmp_path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts processes through /proc")
def test_sigkill_to_a_sweep_leaves_no_process_behind(tmp_path):
    path = tmp_path / "g.json"
    save_graph(resnet(40), path)
    # multiprocessing's pymp-* folder goes here (a short path: it holds a socket)
    temp = Path(tempfile.mkdtemp(prefix="cm"))
    proc = subprocess.Popen([*_cli_command(), "sweep", str(path), "--out", str(tmp_path / "sw"), "--strategies",
                             "chen_sqrtn,checkmate_milp", "--time-limit", "60", "--executor", "process",
                             "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**_env(), "TMPDIR": str(temp)}, start_new_session=True)
    sid = proc.pid
    procs = _wait_for_children(sid, 4, 90)  # the sweep, its forkserver and workers (and their solvers)
    assert proc.poll() is None
    time.sleep(3)  # the workers in their solves
    proc.kill()
    proc.wait(timeout=10)
    time.sleep(8)
    assert _session_processes(sid) == [], (procs, _session_processes(sid))
    assert not list(temp.glob("pymp-*")), list(temp.iterdir())
    temp.rmdir()


def test_every_result_type_converts_numpy_values():
    from checkmate.analysis.max_batch import BatchProbe
    from checkmate.solvers.types import StrategyOutput, json_native

    out = StrategyOutput(None, lower_bound=np.float64(2.5), optimal=np.bool_(True))
    assert type(out.lower_bound) is float and type(out.optimal) is bool
    probe = BatchProbe(np.int64(8), np.bool_(True), "fits", compute_cost=np.float64(3.0),
                       peak_memory_bytes=np.int64(100), overhead=np.float64(np.nan))
    doc = json.loads(json.dumps(probe.to_json_dict(), allow_nan=False))
    assert doc["batch_size"] == 8 and doc["fits"] is True and doc["overhead"] is None
    assert json_native({"a": (np.int32(1), np.array([1.5]))}) == {"a": [1, [1.5]]}


def test_the_cli_leaves_the_callers_sigterm_handler_as_it_was(capsys):
    before = signal.getsignal(signal.SIGTERM)
    assert main(["strategies"]) == 0
    assert signal.getsignal(signal.SIGTERM) == before


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(value=json_value, field=st.sampled_from(["result", "strategy", "budget_bytes", "feasible", "compute_cost",
                                                "peak_memory_bytes", "lower_bound", "optimal", "solve_seconds",
                                                "status", "solver", "min_feasible_budget_bytes"]))
def test_fuzzed_cache_entries_are_misses_or_valid_rows(capsys, value, field):
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        g = tmp / "g.json"
        save_graph(unet_like(), g)
        args = ("sweep", g, "--out", tmp / "sw", "--strategies", "chen_sqrtn,chen_greedy", "--budgets", "2",
                "--executor", "serial", "--cache-dir", tmp / "cache")
        assert run_main(capsys, *args)[0] == 0
        good = _without_seconds((tmp / "sw" / "sweep.csv").read_text())
        for path in _sweep_cache_files(tmp / "cache"):
            doc = json.loads(path.read_text())
            if field == "result":
                doc["result"] = value
            else:
                doc["result"][field] = value
            path.write_text(json.dumps(doc))
        code, _, err = run_main(capsys, *args)
        assert code == 0, err
        assert "Traceback" not in err and "internal error" not in err
        text = (tmp / "sw" / "sweep.csv").read_text()
        if field in ("result", "strategy", "budget_bytes", "feasible"):
            # no other value of these is a row of this point: always a miss, solved again
            assert _without_seconds(text) == good
        # whatever was read, the CSV holds only well-formed rows of the sweep's own grid
        from checkmate.analysis.sweep import read_sweep_csv

        rows = read_sweep_csv(tmp / "sw" / "sweep.csv")
        assert sorted((r.strategy, r.budget_bytes) for r in rows) == sorted(
            (r["strategy"], int(r["budget_bytes"])) for r in good)
        for r in rows:
            assert r.feasible in (True, False)
            for number in (r.compute_cost, r.lower_bound, r.peak_memory_bytes):
                assert number is None or (math.isfinite(number) and number >= 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts processes through /proc")
def test_sigkill_to_a_racing_milp_solve_orphans_nothing(tmp_path):
    path = tmp_path / "g.json"
    save_graph(resnet(40), path)
    proc = subprocess.Popen([*_cli_command(), "solve", str(path), "--budget", "40%", "--strategy", "checkmate_milp",
                             "--time-limit", "120"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=_env(), start_new_session=True)
    sid = proc.pid
    procs = _wait_for_children(sid, 2, 60)  # the solve and its CP-SAT child
    assert len(procs) >= 2 and proc.poll() is None, procs
    proc.kill()
    proc.wait(timeout=10)
    time.sleep(2.0)
    assert _session_processes(sid) == [], (procs, _session_processes(sid))
