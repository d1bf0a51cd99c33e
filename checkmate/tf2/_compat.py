"""Every TensorFlow/Keras version shim or private access of checkmate.tf2, in one place.

Each entry says which version it was written against. Append new entries; keep them small.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

import tensorflow as tf


# --- code generation ------------------------------------------------------------------------------

# Grappler passes that break a rematerialization plan, each switched off while a generated step runs
# (everything else, fusions, layout, constant folding, stays as the user has it). TF 2.21, CPU with
# oneDNN, measured on the MLP, residual CNN and U-Net of tests/tf2/test_codegen.py at 50% of their
# checkpoint-all peak: with every pass on (the dependency optimizer included, whose transitive
# reduction drops only control edges that another path implies) every recomputation runs, none merged
# by the common-subexpression elimination after Grappler, and the measured peaks equal those with the
# meta optimizer off. None is switched off; tests/tf2/test_codegen.py
# (test_every_recomputation_runs_with_grappler_on) fails if one starts to break a plan.
PLAN_BREAKING_PASSES: dict[str, bool] = {}


@contextlib.contextmanager
def plan_preserving_optimizer() -> Iterator[None]:
    """Switch off the Grappler passes in :data:`PLAN_BREAKING_PASSES` for the enclosed block, then
    restore the previous settings.

    TF 2.21: ``tf.config.optimizer.set_experimental_options`` is process-global, and a function call
    takes the options in force when it is made (they are part of its instantiation key); an option
    never set is restored to ``None`` (TF's default).
    """
    if not PLAN_BREAKING_PASSES:
        # setting options, even none, makes TF rebuild the options of every later function call
        yield
        return
    previous = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options(dict(PLAN_BREAKING_PASSES))
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({k: previous.get(k) for k in PLAN_BREAKING_PASSES})


# The name the rest of the package (and user code nesting a generated step) has used for the block
# a generated step runs in; it no longer turns the whole meta optimizer off.
grappler_disabled = plan_preserving_optimizer


def executed_graph_defs(run: Callable[[], object]) -> list:
    """Call ``run()`` and return the post-optimization GraphDefs of the functions it executed.

    TF 2.21 private API: ``tensorflow.python.eager.context`` run metadata (``function_graphs``).
    """
    from tensorflow.python.eager import context as _context

    ctx = _context.context()
    ctx.enable_run_metadata()
    try:
        ctx.export_run_metadata()   # drop whatever an earlier caller left behind
        run()
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    graphs = []
    for fg in metadata.function_graphs:
        graphs.append(fg.post_optimization_graph)
        graphs.extend(fg.partition_graphs)
    return graphs



def profiler_trace(body: Callable[[], object], host_tracer_level: int = 2):
    """Run ``body()`` under TF's profiler and return the trace as an ``XSpace`` protocol buffer.

    TF 2.21: ``tf.profiler.experimental.start``/``stop`` (the documented route) write the trace to
    ``<logdir>/plugins/profile/<run>/<host>.xplane.pb``, read back here with the ``xplane_pb2`` module
    TF ships (``tensorflow.tsl.profiler.protobuf``). The bytes ``ProfilerSession.stop()`` returns
    directly do not parse as that ``XSpace``, so the file is used. Host tracer level 2 records every
    executed op of a function (level 3 recorded the same ops at twice the overhead per op). Raises
    ``RuntimeError`` when the profiler cannot start (one already running) or wrote no trace.
    """
    import glob
    import shutil
    import tempfile

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    logdir = tempfile.mkdtemp(prefix="checkmate-trace-")
    try:
        options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=host_tracer_level,
                                                           python_tracer_level=0, device_tracer_level=1)
        try:
            tf.profiler.experimental.start(logdir, options=options)
        except (tf.errors.OpError, ValueError) as exc:
            raise RuntimeError(f"the TF profiler cannot start: {exc}") from exc
        try:
            body()
        finally:
            tf.profiler.experimental.stop()
        files = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
        if not files:
            raise RuntimeError("the TF profiler wrote no trace")
        space = xplane_pb2.XSpace()
        with open(files[0], "rb") as fh:
            space.ParseFromString(fh.read())
        return space
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def profiler_marker(name: str):
    """A context manager recording an event called ``name`` in a running profiler trace (TF 2.21:
    ``tf.profiler.experimental.Trace``)."""
    return tf.profiler.experimental.Trace(name)


# --- lowering / profiling -------------------------------------------------------------------------

def op_is_stateful(op: "tf.Operation") -> bool:
    """Whether TF registers the op as stateful (TF 2.21: ``Operation.op_def`` is public; ops whose
    type is a function name have no registered OpDef, and are treated as stateful)."""
    try:
        return bool(op.op_def.is_stateful)
    except (AttributeError, KeyError, ValueError):
        return True


def branch_graphs(op: "tf.Operation") -> list:
    """The graphs of the branch functions of an ``If``/``StatelessIf`` op (``then_branch``,
    ``else_branch``), or [] where they cannot be read. TF 2.21 private API: ``Graph._get_function``
    returns the ``AtomicFunction`` registered under the attribute's function name, whose ``graph`` is
    its FuncGraph."""
    graphs = []
    for attr in ("then_branch", "else_branch"):
        try:
            graphs.append(op.graph._get_function(op.get_attr(attr).name).graph)
        except (AttributeError, KeyError, ValueError, TypeError):
            return []
    return graphs


def call_graph(op: "tf.Operation"):
    """The graph of the function a ``PartitionedCall``/``StatefulPartitionedCall`` op calls (its ``f``),
    or None where it cannot be read (TF 2.21 private API, as :func:`branch_graphs`)."""
    try:
        return op.graph._get_function(op.get_attr("f").name).graph
    except (AttributeError, KeyError, ValueError, TypeError):
        return None


def loop_body_graph(op: "tf.Operation"):
    """The graph of a ``While``/``StatelessWhile`` op's ``body`` function, or None where it cannot be
    read (TF 2.21 private API, as :func:`branch_graphs`)."""
    try:
        return op.graph._get_function(op.get_attr("body").name).graph
    except (AttributeError, KeyError, ValueError, TypeError):
        return None


def sublayers(layer: object) -> list:
    """The layers ``layer`` holds directly (a model's layers, a composite layer's sublayers such as a
    transformer block's attention and dense layers). Keras 3 (3.0-3.15): ``Layer._flatten_layers``
    (private) lists the sublayers Keras tracks; ``Model.layers`` is the public form for models only."""
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is None:
        return list(getattr(layer, "layers", None) or [])
    return list(flatten(include_self=False, recursive=False))


# A tensor read by more than this many ops gets its gradients summed as they come (see
# running_gradient_sums): TF's tape sums early once it holds more than this many terms (its
# kMinAggregateCount, TF 2.21), which the running sums rely on.
RUNNING_SUM_MIN_TERMS = 4
# What the tape is told a dense gradient's size is, so that its early summing (for gradients of more
# than 128 MiB together) applies to every tensor read by more than RUNNING_SUM_MIN_TERMS ops.
_EARLY_SUM_ELEMENTS = 1 << 40


@contextlib.contextmanager
def running_gradient_sums() -> Iterator[bool]:
    """While ``tape.gradient`` runs in the block, sum the gradients of a floating-point tensor that more
    than :data:`RUNNING_SUM_MIN_TERMS` ops read as they come, in a chain of
    adds, rather than with one ``AddN`` after the last; yield whether it could (else the tape sums as
    usual).

    An ``AddN`` waits for every term, so all of them are resident at once: a recurrence unrolled in
    Python reads each step's slice of a sequence tensor, and the gradient of every slice is a tensor of
    the whole sequence's size (KerasHub's RWKV-7: six sums of 64 such tensors per layer, held until the
    last step's backward). TF's tape already sums early, every five terms, when the terms
    exceed 128 MiB together; here it does so for every such tensor, and each sum is a chain of adds in
    the order the terms came, so the traced ops (their creation order, which the lowering follows) add
    each group of terms right after it is computed. Each partial sum passes through an ``EnsureShape``
    (a no-op on the same buffer), so that Grappler's arithmetic optimizer, which folds adds with one
    consumer into one ``AddN``, leaves the chain as traced.

    TF 2.21 private API: the tape sizes and sums gradients through the functions of the vector space
    registered with ``pywrap_tfe.TFE_Py_RegisterVSpace``
    (``tensorflow.python.eager.backprop._default_vspace``); the default is registered again on exit.
    """
    try:
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.eager import backprop
        default = backprop._default_vspace
        register = pywrap_tfe.TFE_Py_RegisterVSpace
        default.aggregate_fn, default.num_elements_fn  # noqa: B018 - the fields this relies on
    except (ImportError, AttributeError):
        yield False
        return
    partial: set[str] = set()   # the partial sums made here, by tensor name

    def summable(g) -> bool:
        return isinstance(g, tf.Tensor) and (g.dtype.is_floating or g.dtype.is_complex)

    def num_elements(g):
        return _EARLY_SUM_ELEMENTS if summable(g) else default.num_elements_fn(g)

    def aggregate(gradients):
        if not all(summable(g) for g in gradients) or (
                len(gradients) <= RUNNING_SUM_MIN_TERMS and not any(g.name in partial for g in gradients)):
            return default.aggregate_fn(gradients)
        total = gradients[0]
        for g in gradients[1:]:
            gated = tf.ensure_shape(total, total.shape) if total is not gradients[0] or total.name in partial \
                else total
            total = tf.math.add(gated, g)
        partial.add(total.name)
        return total

    register(default._replace(aggregate_fn=aggregate, num_elements_fn=num_elements))
    try:
        yield True
    finally:
        register(default)


def current_graph_op_count() -> int:
    """Number of ops created so far in the graph being traced (TF 2.21: inside ``tf.function``
    tracing ``tf.compat.v1.get_default_graph()`` is the FuncGraph, and ``get_operations()`` lists
    its ops in creation order, which is a topological order)."""
    return len(tf.compat.v1.get_default_graph().get_operations())


def sync_devices() -> None:
    """Wait for every queued kernel on every device (TF >= 2.13: ``tf.test.experimental.sync_devices``;
    a no-op on CPU, where eager kernels complete before returning)."""
    sync = getattr(getattr(tf.test, "experimental", None), "sync_devices", None)
    if sync is not None and tf.config.list_logical_devices("GPU"):
        sync()


# --- Keras training state (RematModel) --------------------------------------------------------------

def keras_loss_tracker(model: object):
    """The ``Mean`` metric that ``fit`` reports as ``"loss"`` for a compiled model (Keras 3.15:
    ``Trainer._loss_tracker``, created by ``compile``; a custom ``train_step`` that updates it gets
    Keras' own reset and reporting)."""
    return model._loss_tracker


def has_compiled_metrics(model: object) -> bool:
    """Whether ``compile`` was given metrics or weighted metrics (Keras 3.15: ``Trainer._compile_metrics``,
    a ``CompileMetrics`` holding ``_user_metrics`` and ``_user_weighted_metrics``; it exists, empty,
    whenever ``compile`` ran, so only the user's lists say whether there is anything to compute)."""
    metrics = getattr(model, "_compile_metrics", None)
    return metrics is not None and bool(getattr(metrics, "_user_metrics", None) or
                                        getattr(metrics, "_user_weighted_metrics", None))


def compiled_metric_lists(model: object) -> tuple:
    """The metrics and weighted metrics that ``fit`` computes for a compiled model, as
    ``(metrics, weighted_metrics)`` (Keras 3.15: ``Trainer._compile_metrics``' ``_user_metrics`` and
    ``_user_weighted_metrics``; ``(None, None)`` without one). These can differ from what the latest
    ``compile`` call was given: ``compile`` without metrics keeps the ``CompileMetrics`` of an earlier
    call, so a KerasHub task compiled again without ``weighted_metrics`` still reports the ones its
    constructor's ``compile`` gave it."""
    metrics = getattr(model, "_compile_metrics", None)
    if metrics is None:
        return None, None
    return getattr(metrics, "_user_metrics", None), getattr(metrics, "_user_weighted_metrics", None)


def drop_empty_compiled_metrics(model: object) -> None:
    """Remove the empty ``CompileMetrics`` that ``compile(metrics=[])`` or ``weighted_metrics=[]``
    leaves (Keras 3.15: ``Trainer._compile_metrics``). Keras' own train step builds it on its first
    ``compute_metrics`` call, where it reports nothing; a step that computes no metrics never builds
    it, and ``get_metrics_result`` then fails on it ("the metric has not yet been built")."""
    if getattr(model, "_compile_metrics", None) is not None and not has_compiled_metrics(model):
        model._compile_metrics = None


def keras_compiled_loss(model: object):
    """The ``CompileLoss`` that ``compile`` built from its ``loss`` (Keras 3.0-3.15:
    ``Trainer._compile_loss``; ``fit`` builds its structure, a loss tracker per output, before the
    first step), or ``None`` for a model never compiled with a loss."""
    return getattr(model, "_compile_loss", None)


def own_compute_loss(model: object) -> str | None:
    """The name of the class that overrides ``keras.Model.compute_loss`` for ``model`` (Keras 3.0-3.15:
    ``Trainer.compute_loss``, the documented way to customize a model's loss), or ``None``."""
    import keras

    own = getattr(type(model), "compute_loss", None)
    if own is None or own is keras.Model.compute_loss:
        return None
    return next((c.__name__ for c in type(model).__mro__ if "compute_loss" in vars(c)), type(model).__name__)


def call_compute_loss(model: object, compiled, x, y, y_pred, sample_weight, training: bool):
    """``model.compute_loss`` as Keras' train and test steps call it (Keras 3.3+ passes ``training``
    when the method takes it), with ``compiled`` as the ``CompileLoss`` its ``super().compute_loss``
    uses (Keras 3.0-3.15: ``Trainer._compile_loss``): the loss ``RematModel`` was compiled with,
    which the wrapped model may lack or compile differently. The model's own is put back after."""
    import inspect

    before = vars(model).get("_compile_loss")
    object.__setattr__(model, "_compile_loss", compiled)
    try:
        if "training" in inspect.signature(model.compute_loss).parameters:
            return model.compute_loss(x, y, y_pred, sample_weight, training=training)
        return model.compute_loss(x, y, y_pred, sample_weight)
    finally:
        object.__setattr__(model, "_compile_loss", before)


def keras_compile_arguments(model: object) -> dict:
    """What ``compile`` was given, by argument name (Keras 3.0-3.15: ``Trainer._compile_config``, a
    ``SerializableDict`` whose ``config`` holds the arguments); empty for a model never compiled."""
    return getattr(getattr(model, "_compile_config", None), "config", None) or {}


def update_output_losses(model: object, y, y_pred, sample_weight=None) -> None:
    """Update the per-output loss means Keras reports as ``<output>_loss`` for a model with several
    outputs with one batch, as Keras' ``compute_loss`` does in its own train step (Keras 3.15: calling
    ``Trainer._compile_loss``, a ``CompileLoss``, builds them on its first call and updates them; its
    total is not needed)."""
    model._compile_loss(y, y_pred, sample_weight)


def keras_hub_pipeline(model: object):
    """The module of KerasHub's ``PipelineModel`` (the base of its tasks, whose ``fit`` batches array
    inputs with ``tf.data`` or grain and maps the task's ``preprocess_samples`` over them) when
    ``model`` is one, else ``None``. KerasHub 0.32: ``keras_hub.src.utils.pipeline_model`` (private),
    whose module-level ``_build_dataset``, ``_apply_preprocessing`` and ``_train_validation_split``
    prepare ``fit``'s data; found through the model's class, so KerasHub is never imported here."""
    for cls in type(model).__mro__:
        if cls.__name__ == "PipelineModel" and cls.__module__.startswith("keras_hub"):
            module = sys.modules.get(cls.__module__)
            needed = ("_build_dataset", "_apply_preprocessing", "_train_validation_split", "_is_tf_dataset")
            if module is not None and all(hasattr(module, name) for name in needed):
                return module
            return None
    return None


# --- Keras' own train function -----------------------------------------------------------------------

def keras_train_function(model: object, step_function: Callable):
    """The train function Keras' ``fit`` makes for ``model`` around ``step_function`` (a train step of one
    batch): a ``tf.function`` that takes the next batch from a ``tf.data`` iterator inside the graph and
    runs the step in the model's distribution strategy, compiled with XLA where Keras' default
    ``jit_compile="auto"`` would compile it (Keras 3.15, TensorFlow backend:
    ``TensorFlowTrainer._make_function``, which ``make_train_function`` calls with ``train_step``,
    reading ``jit_compile`` as it makes it; ``Trainer._resolve_auto_jit_compile``: off on a CPU-only
    machine)."""
    previous = model._jit_compile
    model._jit_compile = model._resolve_auto_jit_compile()
    try:
        return model._make_function(step_function)
    finally:
        model._jit_compile = previous


def onednn_enabled() -> bool | None:
    """Whether TensorFlow runs oneDNN's CPU kernels (TF 2.21: the private
    ``tensorflow.python.util._pywrap_util_port.IsMklEnabled``, what its start-up notice "oneDNN custom
    operations are on" reports); None when this TensorFlow does not say."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None


# --- weights files -------------------------------------------------------------------------------

def save_weights_in_model_layout(model: object, optimizer: object, filepath: str) -> None:
    """Write ``model``'s weights to a ``.weights.h5`` file as ``model.save_weights`` writes them (its
    layers, its own variables), with ``optimizer``'s state where a compiled model keeps its optimizer's
    (``optimizer/``), so that the wrapped model, or a model built as it was, reads the file.

    Keras 3.15 private API: ``keras.src.saving.saving_lib`` (``H5IOStore``, ``_save_state``), which
    ``keras.Model.save_weights`` uses."""
    from keras.src.saving import saving_lib

    store = saving_lib.H5IOStore(filepath, mode="w")
    try:
        visited = _other_optimizer(model, optimizer)
        saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="",
                               visited_saveables=visited)
        if optimizer is not None and id(optimizer) not in visited:
            saving_lib._save_state(optimizer, weights_store=store, assets_store=None, inner_path="optimizer",
                                   visited_saveables=visited)
    finally:
        store.close()


def _other_optimizer(model: object, optimizer: object) -> set:
    """The saveables a weights file of ``model`` skips: the model's own optimizer when the model was
    compiled with one of its own and ``optimizer`` (the one that trains it) is another, whose state
    takes its place under ``optimizer/`` (a KerasHub task compiles itself when built)."""
    own = getattr(model, "optimizer", None)
    return {id(own)} if optimizer is not None and own is not None and own is not optimizer else set()


def weights_file_groups(filepath: str) -> set[str]:
    """The top-level groups of a ``.weights.h5`` file (Keras 3.15 writes a model's layers under
    ``layers``, its own variables under ``vars``, each attribute's saveable under its name)."""
    import h5py

    with h5py.File(filepath, "r") as f:
        return set(f.keys())


def load_weights_in_model_layout(model: object, optimizer: object, filepath: str, skip_mismatch: bool = False) -> None:
    """Read a file :func:`save_weights_in_model_layout` (or the model's own ``save_weights``) wrote into
    ``model`` and, where the file has it, ``optimizer``. A variable of the model the file lacks is an
    error (a warning with ``skip_mismatch``), as in ``keras.Model.load_weights``; an optimizer not
    built yet is left as it is, with Keras' own warning. Keras 3.15 private API, as above."""
    from keras.src.saving import saving_lib

    groups = weights_file_groups(filepath)
    store = saving_lib.H5IOStore(filepath, mode="r")
    failed: set = set()
    errors: dict = {}
    try:
        visited = _other_optimizer(model, optimizer)
        saving_lib._load_state(model, weights_store=store, assets_store=None, inner_path="",
                               skip_mismatch=skip_mismatch, visited_saveables=visited,
                               failed_saveables=failed, error_msgs=errors)
        if optimizer is not None and "optimizer" in groups and id(optimizer) not in visited:
            saving_lib._load_state(optimizer, weights_store=store, assets_store=None, inner_path="optimizer",
                                   skip_mismatch=skip_mismatch, visited_saveables=visited,
                                   failed_saveables=failed, error_msgs=errors)
    finally:
        store.close()
    if failed:
        saving_lib._raise_loading_failure(errors, warn_only=skip_mismatch)


# --- dict inputs ---------------------------------------------------------------------------------

def in_input_order(model: object, inputs: object) -> object:
    """A dict of inputs with its keys in the order of the model's own input dict. ``tf.nest`` and
    ``tf.data`` sort a dict's keys, and Keras 3.15 (``Functional._maybe_warn_inputs_struct_mismatch``)
    warns that "the structure of `inputs` doesn't match the expected structure" when a functional model
    with dict inputs (a KerasHub task's ``token_ids`` and ``padding_mask``) gets them in another order."""
    if not isinstance(inputs, dict):
        return inputs
    try:
        expected = model.input
    except (AttributeError, ValueError):     # a subclassed model: no input structure of its own
        return inputs
    if not isinstance(expected, dict) or set(expected) != set(inputs) or list(expected) == list(inputs):
        return inputs
    return {key: inputs[key] for key in expected}
