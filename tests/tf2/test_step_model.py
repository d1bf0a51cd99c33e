"""The Keras wrappers' modules: StepTrainer (trainer.py) and CompiledStepModel (step_model.py) load
without the step module or RematModel's, a compiled step wrapper is a StepTrainer, and its saved form
is loaded as RematModel through Keras' registry."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.tf2 import step_model, trainer  # noqa: E402


def tiny() -> keras.Model:
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(inputs), name="tiny")


@pytest.mark.parametrize("module", ["checkmate.tf2.trainer", "checkmate.tf2.step_model"])
def test_the_wrapper_modules_load_without_the_step_module_or_remat_model(module):
    code = (f"import sys, {module}; "
            "loaded = sorted(m for m in ('checkmate.tf2.step', 'checkmate.tf2.keras_model', 'checkmate.tf2.measure') "
            "if m in sys.modules); print(loaded); assert not loaded")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_step_is_recognised_by_what_the_wrapper_reads_of_it():
    class StepLike:
        pass

    step = StepLike()
    for name in step_model.STEP_ATTRIBUTES:
        setattr(step, name, None)
    assert step_model._is_compiled_step(step)
    del step.replica_train
    assert not step_model._is_compiled_step(step)
    assert not step_model._is_compiled_step(tiny())
    assert not step_model._is_compiled_step(None)
    with pytest.raises(checkmate.errors.InvalidArgumentError, match="wraps a step from checkmate.tf2.compile"):
        step_model.CompiledStepModel(tiny())


def test_both_wrappers_are_step_trainers_and_remat_model_keeps_its_name_and_checks():
    remat = checkmate.tf2.RematModel(tiny(), budget="80%")
    assert isinstance(remat, trainer.StepTrainer)
    assert issubclass(step_model.CompiledStepModel, trainer.StepTrainer)
    assert checkmate.tf2.keras_model.CompiledStepModel is step_model.CompiledStepModel
    assert keras.saving.get_registered_object(trainer.MODEL_FORM_NAME) is checkmate.tf2.RematModel
    with pytest.raises(checkmate.errors.InvalidArgumentError, match="needs a keras.Model.*load the file"):
        checkmate.tf2.RematModel("model.keras")


def test_a_saved_wrapper_loads_as_remat_model_and_names_what_is_missing(monkeypatch):
    config = checkmate.tf2.RematModel(tiny(), budget=1 << 20, strategy="checkmate_milp").get_config()
    loaded = step_model.CompiledStepModel.from_config(copy.deepcopy(config))
    assert type(loaded) is checkmate.tf2.RematModel
    assert loaded.budget == 1 << 20 and loaded.strategy == "checkmate_milp"
    # RematModel not registered (its module never imported): a clear error, not a missing attribute
    monkeypatch.setattr(keras.saving, "get_registered_object", lambda *a, **k: None)
    with pytest.raises(checkmate.errors.InvalidArgumentError, match="import checkmate.tf2.keras_model"):
        step_model.CompiledStepModel.from_config(copy.deepcopy(config))
