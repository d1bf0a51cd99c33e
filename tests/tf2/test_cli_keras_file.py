"""A user's own model on the CLI: a saved ``.keras`` file with two inputs, two outputs and a custom
layer compiles from ``checkmate compile --model model.keras --custom-objects mymod:CUSTOM_OBJECTS``
(input shapes from the model, loss from its compiled configuration), extracts, and its saved plan
trains in ``RematModel`` without solving."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
import checkmate.solvers  # noqa: E402
from checkmate.cli import main as cli_main  # noqa: E402
from checkmate.graph import load_graph  # noqa: E402

pytestmark = pytest.mark.tf

BATCH = 8
STEPS = 256

# the module a user keeps beside the model: a custom layer that Keras cannot find without it
MODULE = '''
import keras


class Gate(keras.layers.Layer):
    """x * sigmoid(x W): a custom layer with weights of its own."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units), initializer="glorot_uniform", name="w")

    def call(self, x):
        return x * keras.ops.sigmoid(keras.ops.matmul(x, self.w))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


CUSTOM_OBJECTS = {"Gate": Gate}
NOT_A_DICT = [Gate]
'''


def tagger(module):
    """Two inputs (a sequence, per-sequence features), two outputs (a class by index, a class by one-hot)."""
    keras.utils.set_random_seed(0)
    tokens = keras.Input((STEPS, 6), name="tokens")
    meta = keras.Input((3,), name="meta")
    h = keras.layers.Conv1D(32, 3, padding="same", activation="relu", name="c1")(tokens)
    h = module.Gate(32, name="gate")(h)
    for k in range(2, 8):
        h = keras.layers.Conv1D(32, 3, padding="same", activation="relu", name=f"c{k}")(h)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    tags = keras.layers.Dense(5, name="tags")(pooled)
    joined = keras.layers.Concatenate(name="join")([pooled, keras.layers.Dense(8, name="meta_dense")(meta)])
    kind = keras.layers.Dense(3, name="kind")(joined)
    model = keras.Model([tokens, meta], [tags, kind], name="tagger")
    model.compile(optimizer="adam", loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                          keras.losses.CategoricalCrossentropy(from_logits=True)])
    return model


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A directory holding the user's module (a name of its own: imports are cached per process) and
    the saved model, as the current directory."""
    name = f"usermod_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module(name)
    tagger(module).save(tmp_path / "model.keras")
    return tmp_path, name, module


def test_compile_a_keras_file_with_custom_objects_and_train_with_its_plan(workdir, monkeypatch):
    path, name, module = workdir
    # the exact form users type, in a process of its own started in their directory
    proc = subprocess.run([sys.executable, "-m", "checkmate", "compile", "--model", "model.keras", "--custom-objects",
                           f"{name}:CUSTOM_OBJECTS", "--batch-size", "8", "--budget", "75%", "--steps", "1",
                           "--save-plan", "plan.json", "--json"], capture_output=True, text=True, timeout=600, cwd=path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["model"] == "model.keras" and report["batch_size"] == BATCH
    ok = [row for row in report["rows"] if row["status"] == "ok"]
    assert ok and all(row["max_grad_rel_diff"] < 1e-4 for row in ok), report["rows"]
    assert report["plan"]["strategy"] == min(ok, key=lambda r: r["predicted_overhead"])["strategy"]
    plan = json.loads((path / "plan.json").read_text())
    assert plan["format"] == "checkmate-schedule/1" and plan["checkmate_plan"]["batch_size"] == BATCH

    # RematModel trains the loaded model with that plan: no solve, the loss of plain Keras
    solves = []
    real = checkmate.solvers.solve
    monkeypatch.setattr(checkmate.solvers, "solve", lambda *a, **k: solves.append(a) or real(*a, **k))
    model = keras.saving.load_model(path / "model.keras", custom_objects=module.CUSTOM_OBJECTS)
    plain = keras.saving.load_model(path / "model.keras", custom_objects=module.CUSTOM_OBJECTS)
    rng = np.random.default_rng(0)
    x = [rng.standard_normal((2 * BATCH, STEPS, 6)).astype("float32"),
         rng.standard_normal((2 * BATCH, 3)).astype("float32")]
    y = [rng.integers(0, 5, (2 * BATCH,)).astype("int32"),
         np.eye(3, dtype="float32")[rng.integers(0, 3, 2 * BATCH)]]
    losses = [keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              keras.losses.CategoricalCrossentropy(from_logits=True)]
    trainer = checkmate.tf2.RematModel(model, budget="75%", plan="plan.json")
    trainer.compile(keras.optimizers.SGD(0.1), losses)
    got = trainer.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False).history
    assert not solves
    assert "plan.json" in trainer.compiled_step().result.status
    plain.compile(keras.optimizers.SGD(0.1), losses, jit_compile=False)
    want = plain.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False).history
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
    # each output's loss as well (the plan's step has no predictions: from an inference pass)
    assert set(got) == set(want) == {"loss", "tags_loss", "kind_loss"}


def test_extract_a_keras_file_with_several_inputs_and_outputs(workdir, capsys):
    path, name, _ = workdir
    out = path / "graph.json"
    assert cli_main(["extract", "--keras-file", "model.keras", "--custom-objects", f"{name}:CUSTOM_OBJECTS",
                     "--batch-size", "4", "--cost-model", "flops", "--out", str(out)]) == 0
    graph = load_graph(out)
    assert {"gate", "tags", "kind", "meta_dense"} <= {n.split("_grad")[0] for n in graph.names}
    # --model takes the file as well
    assert cli_main(["extract", "--model", "model.keras", "--custom-objects", f"{name}:CUSTOM_OBJECTS",
                     "--batch-size", "4", "--cost-model", "flops", "--out", str(out)]) == 0


@pytest.mark.parametrize("spec, message", [
    (None, "custom-objects MODULE:ATTR"),
    ("{name}", "expected MODULE:ATTR"),
    ("{name}:MISSING", "has no 'MISSING'"),
    ("{name}:NOT_A_DICT", "is a list, expected a dict"),
    ("no_such_module_here:X", "cannot import 'no_such_module_here'"),
])
def test_custom_object_errors_are_one_line_with_exit_2(workdir, capsys, spec, message):
    path, name, _ = workdir
    args = ["extract", "--model", "model.keras", "--batch-size", "4", "--cost-model", "flops",
            "--out", str(path / "g.json")]
    if spec is not None:
        args += ["--custom-objects", spec.format(name=name)]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
