"""Per-point result cache: resumes without recomputing, never returns another key's result."""

import json

import pytest

from checkmate.errors import OutputPathError

from checkmate.analysis.point_cache import PointCache


def test_resume_reads_instead_of_recomputing(tmp_path):
    calls = []

    def compute(x):
        calls.append(x)
        return {"value": x * 2}

    first = PointCache(tmp_path / "c")
    assert [first.get_or_compute({"x": x, "m": "a"}, lambda x=x: compute(x)) for x in range(3)] == [
        {"value": 0}, {"value": 2}, {"value": 4}]
    again = PointCache(tmp_path / "c")
    # keys built in another order are the same point
    assert again.get_or_compute({"m": "a", "x": 1}, lambda: compute(99)) == {"value": 2}
    assert calls == [0, 1, 2] and again.hits == 1 and again.misses == 0
    assert len(again) == 3


def test_mismatched_or_corrupt_files_are_misses(tmp_path):
    cache = PointCache(tmp_path)
    cache.put({"k": 1}, {"v": 1})
    (path,) = list(tmp_path.glob("*.json"))
    stored = json.loads(path.read_text())
    stored["key"] = '{"k":2}'
    path.write_text(json.dumps(stored))
    assert cache.get({"k": 1}) is None
    path.write_text("{truncated")
    assert cache.get({"k": 1}) is None
    assert cache.get_or_compute({"k": 1}, lambda: {"v": 3}) == {"v": 3}
    assert cache.get({"k": 1}) == {"v": 3}


def test_disabled_cache_stores_nothing(tmp_path):
    cache = PointCache(None)
    assert cache.get_or_compute({"k": 1}, lambda: {"v": 1}) == {"v": 1}
    assert cache.get({"k": 1}) is None and len(cache) == 0


def test_a_cache_directory_that_cannot_be_one_is_refused_up_front(tmp_path):
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file", tmp_path / "file" / "below"):
        with pytest.raises(OutputPathError, match="not a directory"):
            PointCache(bad)
    PointCache(tmp_path / "new" / "deeper")      # created on first write
