"""The number formatters of the results tables, and the committed results README being what the
generator writes from the committed result files."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _load(name: str):
    if str(EXPERIMENTS) not in sys.path:  # results_readme imports its sibling ``common`` by name
        sys.path.insert(0, str(EXPERIMENTS))
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = _load("common")


@pytest.mark.parametrize("value, sig, text", [
    (0.3556112149999535, 3, "0.356"),
    (81.3, 4, "81.30"),        # trailing zeros kept: the figures say how precise the number is
    (100, 3, "100"),           # no dangling decimal point
    (742764.6603840002, 3, "742,765"),
    (999.7, 3, "1,000"),       # rounds up past the figures: a whole number, not "1.00e+03"
    (0.02323732999866479, 3, "0.0232"),
    ("", 3, "–"),
    (None, 3, "–"),
])
def test_fmt_sig(value, sig, text):
    assert common.fmt_sig(value, sig) == text


def test_seconds_ratios_and_integers_carry_their_units():
    assert common.fmt_seconds(0.3556112149999535) == "0.356 s"
    assert common.fmt_seconds("301.7382476620005") == "302 s"
    assert common.fmt_seconds(13.59) == "13.6 s"
    assert common.fmt_ratio(1.000060544639442) == "1.000x"
    assert common.fmt_ratio("1.0796812749003983") == "1.080x"
    assert common.fmt_ratio(0.97501, 3) == "0.975x"
    assert common.fmt_ratio(30.483) == "30.48x"
    assert common.fmt_int("1001") == "1,001"
    assert common.fmt_int(48) == "48"
    assert common.fmt_bytes("441468518") == "421.02 MiB"


def test_fmt_percent():
    assert common.fmt_percent(0.0009405838238405183) == "0.09%"
    assert common.fmt_percent(0.19464394104205981) == "19.46%"
    assert common.fmt_percent(0.0) == "0%"
    assert common.fmt_percent(9.727630282220856e-07) == "<0.01%"  # not an exact zero
    assert common.fmt_percent("0.7", 0) == "70%"
    assert common.fmt_percent("") == "–"


def test_fmt_cost():
    assert common.fmt_cost(81.3) == "81.30"
    assert common.fmt_cost(80.50000076293945) == "80.50"
    assert common.fmt_cost(742764.6603840002) == "742,765"
    assert common.fmt_cost(2972915537281.0) == "2.973e12"
    assert common.fmt_cost(None) == "–"


def test_fmt_small():
    assert common.fmt_small("0.0") == "0"
    assert common.fmt_small(0.0016344) == "1.6e-03"
    assert common.fmt_small(None) == "–"


def test_committed_readme_is_what_the_generator_writes(tmp_path):
    results = EXPERIMENTS / "results"
    for path in results.iterdir():
        if path.is_file() and path.name != "README.md":
            shutil.copy(path, tmp_path / path.name)
    written = _load("results_readme").write_readme(tmp_path)
    assert written.read_text() == (results / "README.md").read_text()
