import json

import numpy as np
import pytest

from cases import training_chain, unet_like
from checkmate import InvalidBudgetError, InvalidScheduleError, Schedule, load_schedule, parse_budget, save_schedule, simulate
from checkmate.solvers import checkpoint_all_peak
from checkmate.solvers.baselines import checkpoint_all_schedule


def test_schedule_round_trip(tmp_path):
    g = unet_like()
    s = checkpoint_all_schedule(g).with_meta(strategy="checkpoint_all", budget_bytes=999)
    path = tmp_path / "s.json"
    save_schedule(s, path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "checkmate-schedule/1" and doc["graph"] == g.name
    assert doc["strategy"] == "checkpoint_all" and doc["budget_bytes"] == 999
    assert doc["plan"][0] == ["compute", 0]
    back = load_schedule(path, g)
    assert back == s and back.strategy == "checkpoint_all" and back.budget_bytes == 999
    assert simulate(g, back).peak_memory_bytes == simulate(g, s).peak_memory_bytes


def test_schedule_file_errors(tmp_path):
    g = training_chain(2)
    path = tmp_path / "s.json"
    path.write_text("{not json")
    with pytest.raises(InvalidScheduleError, match="malformed JSON"):
        load_schedule(path, g)
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(InvalidScheduleError, match="checkmate-schedule/1"):
        load_schedule(path, g)
    path.write_text(json.dumps({"format": "checkmate-schedule/1", "recompute": [[0, 9]], "retain": [], "plan": []}))
    with pytest.raises(InvalidScheduleError, match="node 9"):
        load_schedule(path, g)


def test_parse_budget_forms():
    g = training_chain(4)
    peak = checkpoint_all_peak(g)
    assert parse_budget(1000) == 1000
    assert parse_budget("2GiB") == 2 * 2**30
    assert parse_budget("1.5GB") == 1_500_000_000
    assert parse_budget("512 MiB") == 512 * 2**20
    assert parse_budget("100%", g) == peak
    assert parse_budget("50%", g) == peak // 2
    assert parse_budget("1e3") == 1000
    for bad in ["", "abc", "-5", "0", "5 parsecs", "50%x", None, True, float("nan")]:
        with pytest.raises(InvalidBudgetError):
            parse_budget(bad, g)
    with pytest.raises(InvalidBudgetError, match="needs a graph"):
        parse_budget("50%")
    # a fraction is not a byte count: the error suggests the percentage
    for fraction in [0.7, "0.7"]:
        with pytest.raises(InvalidBudgetError, match="less than one byte.*'70%'"):
            parse_budget(fraction, g)
    with pytest.raises(InvalidBudgetError, match="less than one byte$"):
        parse_budget("0.0001KB", g)
    assert parse_budget("0.5KiB") == 512 and parse_budget(2.0) == 2 and parse_budget("1.1KiB") == 1126
    # a plain byte count must be whole: flooring 1.9 bytes to 1 would silently change the budget
    for fractional in [1.9, "1.5", "7.5B"]:
        with pytest.raises(InvalidBudgetError, match="whole number of bytes"):
            parse_budget(fractional, g)


def test_json_text_parses_back_with_one_line_per_member_and_flat_lists_on_one_line():
    from checkmate.io import json_text

    doc = {"format": "x", "pairs": [[0, 1], [2, 3]], "nodes": [{"b": [1, 2], "id": 0}, {"id": 1}],
           "meta": {"z": 1.5, "a": None, "nested": {"k": [True, "s"]}}, "empty": {}, "none": [],
           "ints": {1: "one"}}
    for indent, sort in ((1, False), (0, True), (2, False)):
        text = json_text(doc, indent=indent, sort_keys=sort)
        assert json.loads(text) == json.loads(json.dumps(doc))
        lines = [line.rstrip(",") for line in text.splitlines()]
        pad = " " * indent
        assert f'{pad}"pairs": [[0, 1], [2, 3]]' in lines
        # a list of objects: one object a line
        assert f'{pad * 2}{{"b": [1, 2], "id": 0}}' in lines
        assert f'{pad * 2}"nested": {{' in lines
    assert json_text(doc, indent=None) == json.dumps(doc)
    # sort_keys orders every level
    text = json_text(doc, indent=1, sort_keys=True)
    assert text.index('"a": null') < text.index('"z": 1.5') and text.index('"empty"') < text.index('"format"')


def test_a_large_schedule_is_written_with_its_pairs_on_one_line(tmp_path):
    from checkmate.graph import GraphBuilder

    builder = GraphBuilder("chain")
    previous = []
    for i in range(300):
        previous = [builder.add_node(f"n{i}", 1.0, 8, previous[-1:], backward=i >= 150, output=i == 299)]
    g = builder.build()
    s = checkpoint_all_schedule(g)
    path = tmp_path / "s.json"
    save_schedule(s, path)
    text = path.read_text()
    # one line per member of the document, not one per number (indent=1 gave over 4 lines per pair)
    assert len(text.splitlines()) < 20
    assert load_schedule(path, g) == s
