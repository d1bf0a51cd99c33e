import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# Solved schedules are cached on disk by default; tests solve what they assert on, so the cache is off
# unless a test turns it on (with a directory of its own). Child processes inherit the setting.
os.environ.setdefault("CHECKMATE_SCHEDULE_CACHE", "0")
# oneDNN's CPU kernels, which checkmate.tf2 asks TensorFlow for when it is imported first
# (checkmate.kernels): test modules import TensorFlow before it. On a CPU without AVX-512 TensorFlow
# would otherwise run Eigen's kernels, whose convolution gradients' workspaces no plan counts.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
