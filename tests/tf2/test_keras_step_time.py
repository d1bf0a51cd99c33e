"""RematModel's step-time report after its first epoch: a real, interleaved measurement of the
compiled step against the plain one, reported beside the predicted overhead, that trains nothing."""

from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.tf2.trainer import STEP_TIME_REPORT_MIN_REPEATS, STEP_TIME_REPORT_REPEATS  # noqa: E402


def mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12,))
    h = keras.layers.Dense(32, activation="relu")(inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    return keras.Model(inputs, keras.layers.Dense(5)(h), name="mlp")


class CountCalls:
    """Counts the calls of a function it stands in for."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


class Spy(keras.callbacks.Callback):
    """Keeps the weights as the first epoch left them (this callback's ``on_epoch_end`` runs before
    the report's, which RematModel adds last)."""

    def __init__(self, trainer):
        super().__init__()
        self.trainer = trainer
        self.weights_after_epoch = None

    def on_epoch_end(self, epoch, logs=None):
        if self.weights_after_epoch is None:
            self.weights_after_epoch = [v.numpy() for v in self.trainer.inner.variables]


def test_first_epoch_reports_a_real_interleaved_measurement_against_keras_own_train_step(caplog, capsys, monkeypatch):
    from checkmate.tf2 import timing
    from checkmate.tf2.trainer import KERAS_REFERENCE

    timed = []
    original = timing.interleaved_samples

    def counted(fns, *args, **kwargs):
        # the functions measured, each counted as it runs
        timed.extend(CountCalls(fn) for fn in fns)
        return original(timed[-len(fns):], *args, **kwargs)

    monkeypatch.setattr(timing, "interleaved_samples", counted)
    keras_steps = []
    keras_train_step = keras.Model.train_step

    def keras_own(self, data):
        # runs while Keras' own train function is traced
        keras_steps.append(self)
        return keras_train_step(self, data)

    monkeypatch.setattr(keras.Model, "train_step", keras_own)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 12)).astype("float32")
    y = rng.integers(0, 5, (32,)).astype("int32")
    trainer = checkmate.tf2.RematModel(mlp(), budget="100%", strategy="checkpoint_all",
                                       compile_options={"cost_model": "flops"})
    trainer.compile(keras.optimizers.SGD(0.1),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    spy = Spy(trainer)
    with caplog.at_level(logging.INFO, logger="checkmate.tf2"):
        trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[spy])
    step = trainer.compiled_step()
    measured = step.measured
    assert measured is not None and measured.repeats == STEP_TIME_REPORT_REPEATS
    assert measured.reference == KERAS_REFERENCE
    # RematModel's train function, Keras' own (its train_step, on this model) and the plain traced
    # gradients were all run: a warm-up call and one per repeat (the gradients once more, the call
    # that checks the batch fits them)
    assert [t.calls for t in timed] == [STEP_TIME_REPORT_REPEATS + 1] * 2 + [STEP_TIME_REPORT_REPEATS + 1]
    assert measured.gradient_seconds is not None and measured.gradient_seconds > 0
    assert 0.0 < measured.gradient_share <= 1.0
    assert keras_steps and all(m is trainer for m in keras_steps)
    assert measured.step_seconds > 0 and measured.plain_seconds > 0
    assert measured.cpu_ratio is not None and measured.cpu_ratio > 0
    assert measured.ratio == pytest.approx(measured.step_seconds / measured.plain_seconds)
    # with verbose=0 the line goes to the log only, the ratio beside the predicted overhead
    assert "checkmate: step time" not in capsys.readouterr().out
    lines = [r.getMessage() for r in caplog.records if "checkmate: step time" in r.getMessage()]
    assert len(lines) == 1
    assert (f"step time {measured.ratio:.3f}x the plain step (predicted "
            f"{measured.describe_expected(step.predicted.time_overhead)}; {measured.describe()})") in lines[0]
    assert f"{step.predicted.time_overhead:.3f}x on its gradients, {measured.gradient_share:.0%}" in lines[0]
    assert "Keras' own train step" in lines[0]
    # both train functions updated the weights, the optimizer and the loss tracker while timed: all of
    # it is put back, so the weights are those the epoch's batches left
    for before, v in zip(spy.weights_after_epoch, trainer.inner.variables):
        np.testing.assert_array_equal(v.numpy(), before)
    assert int(trainer.optimizer.iterations.numpy()) == 4
    assert f"measured {measured.ratio:.3f}x the plain step" in step.summary()
    assert f"the prediction comes to {measured.describe_expected(step.predicted.time_overhead)}" in step.summary()


def test_a_slow_step_is_reported_from_fewer_rounds(monkeypatch):
    from checkmate.tf2 import trainer as trainer_module

    # every round past the least takes "too long": the report stops at the least number of rounds
    monkeypatch.setattr(trainer_module, "STEP_TIME_REPORT_MAX_S", 0.0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 12)).astype("float32")
    y = rng.integers(0, 5, (16,)).astype("int32")
    trainer = checkmate.tf2.RematModel(mlp(), budget="100%", strategy="checkpoint_all",
                                       compile_options={"cost_model": "flops"})
    trainer.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    measured = trainer.compiled_step().measured
    assert measured is not None and measured.repeats == STEP_TIME_REPORT_MIN_REPEATS < STEP_TIME_REPORT_REPEATS
    assert f"median of {STEP_TIME_REPORT_MIN_REPEATS}" in measured.describe()


def test_interleaved_samples_stop_early_only_past_the_least_rounds_and_the_time_given():
    import time

    from checkmate.tf2.timing import interleaved_samples

    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.02)
        return tf.constant(0.0)

    wall, cpu = interleaved_samples([slow, slow], repeats=15, min_repeats=3, max_seconds=0.1)
    # three rounds of two 20 ms calls take over 0.1 s: the fourth is not started
    assert [len(w) for w in wall] == [len(c) for c in cpu] == [3, 3]
    assert len(calls) == 2 + 6           # a warm-up call each, then the rounds
    wall, _ = interleaved_samples([slow], repeats=4, min_repeats=3, max_seconds=60.0)
    assert [len(w) for w in wall] == [4]
    wall, _ = interleaved_samples([slow], repeats=5)
    assert [len(w) for w in wall] == [5]


def test_measure_step_time_times_the_gradients_or_the_whole_training_step_and_trains_nothing():
    """A compiled step's measured time is its gradients' against the plain step's (what the predicted
    overhead predicts); gradients_only=False times a training step (gradients and optimizer update)
    against the plain traced step with the same update. Neither leaves the weights or the optimizer
    changed."""
    from checkmate.tf2 import timing

    model = mlp()
    optimizer = keras.optimizers.Adam(0.1)
    step = checkmate.tf2.compile(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer,
                                 tf.TensorSpec((8, 12)), tf.TensorSpec((8,), tf.int32), budget="100%",
                                 strategy="checkpoint_all", cost_model="flops")
    rng = np.random.default_rng(2)
    x = tf.constant(rng.standard_normal((8, 12)).astype("float32"))
    y = tf.constant(rng.integers(0, 5, (8,)).astype("int32"))
    step(x, y)       # the optimizer built and one step taken
    weights = [v.numpy() for v in model.variables]
    slots = [v.numpy() for v in optimizer.variables]
    measured = step.measure_time(x, y, repeats=2, gradients_only=False)
    assert measured.reference == timing.TRAIN_STEP_REFERENCE and measured.plain_seconds > 0
    # the plain gradients were timed in the same rounds: their share of the training step
    assert measured.gradient_seconds is not None and 0.0 < measured.gradient_share <= 1.0
    gradients = step.measure_time(x, y, repeats=2)
    assert gradients.reference == timing.GRADIENTS_REFERENCE and step.measured is gradients
    assert gradients.gradient_seconds is None and gradients.gradient_share == 1.0
    assert gradients.expected_ratio(1.2) == pytest.approx(1.2) and gradients.describe_expected(1.2) == "1.200x"
    for before, v in zip(weights + slots, list(model.variables) + list(optimizer.variables)):
        np.testing.assert_array_equal(v.numpy(), before)
    # the plain train function does update: one call changes the weights and counts an iteration
    timing.plain_train_function(step)(*step.function.flat_args(x, y))
    assert int(optimizer.iterations.numpy()) == 2
    assert any(not np.array_equal(v.numpy(), w) for v, w in zip(model.trainable_variables, weights))


def checkpoint_all_trainer(seed: int, rows: int):
    """Random rows of the MLP's features and labels, and a compiled RematModel of it that recomputes
    nothing (FLOPs costs: no profiling in these tests)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 12)).astype("float32")
    y = rng.integers(0, 5, (rows,)).astype("int32")
    trainer = checkmate.tf2.RematModel(mlp(), budget="100%", strategy="checkpoint_all",
                                       compile_options={"cost_model": "flops"})
    trainer.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return x, y, trainer


def test_epochs_and_fit_calls_after_the_first_trace_nothing_again():
    """An epoch costs the step and no tracing: the train function is traced once per batch shape, not
    per epoch or per ``fit`` call (a fit timed epoch by epoch pays no first-epoch cost again)."""
    x, y, trainer = checkpoint_all_trainer(seed=1, rows=24)
    traced = []
    own = trainer.train_step

    def counted(data):
        # runs only while the train function is traced
        traced.append(tuple(int(d) for d in tf.nest.flatten(data)[0].shape))
        return own(data)

    trainer.train_step = counted
    trainer.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert traced == [(8, 12)]
    step = trainer.compiled_step()
    trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert traced == [(8, 12)] and trainer.compiled_step() is step
    # a short last batch is padded to the compiled step (no batch statistics): one trace of its shape
    trainer.fit(x[:20], y[:20], batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert traced == [(8, 12), (4, 12)] and set(trainer.compiled_steps) == {8}


def test_report_times_the_step_where_keras_own_train_step_cannot_run(caplog, monkeypatch):
    """Keras' own train step refusing the batch does not stop fit(): the step is timed against the plain
    traced train step instead, and the log says why."""
    from checkmate.tf2 import timing, trainer as trainer_module

    def refuses(*args, **kwargs):
        raise ValueError("Dimensions must be equal, but are 12 and 8\nmore detail")

    monkeypatch.setattr(trainer_module, "measure_against_keras", refuses)
    x, y, trainer = checkpoint_all_trainer(seed=3, rows=16)
    with caplog.at_level(logging.INFO, logger="checkmate.tf2"):
        history = trainer.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 2
    measured = trainer.compiled_step().measured
    assert measured is not None and measured.reference == timing.TRAIN_STEP_REFERENCE
    messages = [r.getMessage() for r in caplog.records]
    assert any("could not run the first batch (Dimensions must be equal, but are 12 and 8)" in m for m in messages)
    assert sum("checkmate: step time" in m for m in messages) == 1


def test_report_says_the_plain_step_does_not_fit_and_fit_goes_on(caplog, monkeypatch):
    """On a device where the plain step runs out of memory (what a model that needs rematerialization
    does), the report names that, measures nothing, tries no second plain step, and fit() goes on."""
    from checkmate.tf2 import step as step_module, trainer as trainer_module

    def out_of_memory(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[8,4096]\nmore")

    second_tries = []
    monkeypatch.setattr(trainer_module, "measure_against_keras", out_of_memory)
    monkeypatch.setattr(step_module.CompiledStep, "measure_time", lambda *a, **k: second_tries.append(1))
    x, y, trainer = checkpoint_all_trainer(seed=4, rows=16)
    with caplog.at_level(logging.INFO, logger="checkmate.tf2"):
        history = trainer.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 2 and not second_tries
    assert trainer.compiled_step().measured is None
    messages = [r.getMessage() for r in caplog.records]
    assert any("step time not measured: the plain step does not fit in the device's memory (OOM when allocating"
               in m for m in messages)
    assert not any("checkmate: step time " in m and "x the plain step" in m for m in messages)


def conv_net() -> keras.Model:
    """Convolutions with batch normalization: moving-statistics updates beside the optimizer's."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 3))
    h = inputs
    for _ in range(4):
        h = keras.layers.Conv2D(8, 3, padding="same")(h)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.ReLU()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(5)(h), name="conv_net")


# ops that write a variable: the optimizer's updates, the moving statistics, the loss tracker's sums
VARIABLE_WRITES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def executed_train_graph(model, dataset) -> "tf.compat.v1.GraphDef":
    """The largest graph that ``model``'s train function runs for one batch of ``dataset``, as
    TensorFlow executes it (after inlining and Grappler), from a train function made afresh."""
    from checkmate.tf2 import _compat

    model.make_train_function(force=True)
    batches = iter(dataset)
    graphs = _compat.executed_graph_defs(lambda: model.train_function(batches))
    return max(graphs, key=lambda g: len(g.node))


def test_the_train_function_runs_one_flat_graph_with_the_updates_of_keras_own():
    """An epoch costs its step: RematModel's train function runs as one graph (the compiled step and
    the optimizer's update inlined into it, no function call left) that writes the variables as often
    as Keras' own train function does (no second optimizer apply, no extra moving-statistics update),
    and each gradient is applied as soon as it is computed (no update waits for all of them)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 12, 12, 3)).astype("float32")
    y = rng.integers(0, 5, (16,)).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    plain = conv_net()
    plain.compile(keras.optimizers.SGD(0.05, momentum=0.9), loss)
    trainer = checkmate.tf2.RematModel(conv_net(), budget="50% activations", compile_options={"cost_model": "flops"})
    trainer.compile(keras.optimizers.SGD(0.05, momentum=0.9), loss)
    for model in (plain, trainer):
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert trainer.compiled_step().predicted.recompute_count > 0
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    ours, keras_own = executed_train_graph(trainer, dataset), executed_train_graph(plain, dataset)

    def count(graph, kinds):
        return sum(1 for node in graph.node if node.op in kinds or node.op.startswith(kinds))

    calls = ("PartitionedCall", "StatefulPartitionedCall")
    assert count(ours, calls) == 0 and count(keras_own, calls) == 0
    writes = count(keras_own, VARIABLE_WRITES + ("ResourceApply",))
    assert writes > 0 and count(ours, VARIABLE_WRITES + ("ResourceApply",)) == writes

    def waiting_for_every_filter_gradient(graph):
        parents = {n.name: [i.lstrip("^").split(":")[0] for i in n.input] for n in graph.node}
        filters = {n.name for n in graph.node if "BackpropFilter" in n.op}
        waiting = 0
        for node in graph.node:
            if not node.op.startswith(VARIABLE_WRITES + ("ResourceApply",)):
                continue
            seen, stack = set(), [node.name]
            while stack:
                for parent in parents.get(stack.pop(), ()):
                    if parent not in seen:
                        seen.add(parent)
                        stack.append(parent)
            waiting += filters <= seen
        return len(filters), waiting

    filters, keras_waiting = waiting_for_every_filter_gradient(keras_own)
    assert filters == 4
    filters, waiting = waiting_for_every_filter_gradient(ours)
    # at most three: the first convolution's kernel's two momentum writes (its gradient is computed
    # last in any order) and one write that the plan's order places after the backward pass; never
    # the updates of the other layers, which would then all run in a tail after the gradients
    assert waiting <= keras_waiting + 3


def test_a_predicted_overhead_of_the_gradients_applies_to_their_share_of_a_whole_step():
    """The recomputations lengthen the gradients, not the optimizer's update or the metrics: against
    a whole training step the predicted overhead comes to one plus its excess times the gradients'
    measured share of that step (clipped to [0, 1])."""
    from checkmate.tf2.timing import GRADIENTS_REFERENCE, MeasuredTime

    whole = MeasuredTime(step_seconds=0.5, plain_seconds=0.4, repeats=3, gradient_seconds=0.3)
    assert whole.gradient_share == pytest.approx(0.75)
    assert whole.expected_ratio(1.2) == pytest.approx(1.15)
    assert whole.expected_ratio(1.0) == pytest.approx(1.0)
    assert whole.describe_expected(1.2) == "1.150x for the whole step (1.200x on its gradients, 75% of the plain step's time)"
    # gradients timed slower than the whole step (noise, a step with nothing besides them): all of it
    assert MeasuredTime(0.5, 0.4, 3, gradient_seconds=0.45).expected_ratio(1.2) == pytest.approx(1.2)
    gradients = MeasuredTime(0.5, 0.4, 3, reference=GRADIENTS_REFERENCE)
    assert gradients.gradient_share == 1.0 and gradients.expected_ratio(1.2) == pytest.approx(1.2)
