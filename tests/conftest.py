import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# Solved schedules are cached on disk by default; tests solve what they assert on, so the cache is off
# unless a test turns it on (with a directory of its own). Child processes inherit the setting.
os.environ.setdefault("CHECKMATE_SCHEDULE_CACHE", "0")
# TensorFlow's x86 wheels run oneDNN kernels only on CPUs with AVX-512 unless this asks for them; on
# others (AMD Zen 2, with AVX2) they run Eigen's kernels, whose convolution gradients allocate
# workspaces of their own: there the measured peaks of the tests' convolutional models stay near the
# plain step's whatever the plan (a U-Net's plan at 50% measured 0.90x the plain step), and a
# Flatten's Reshape leaves no event in the profiler's trace. The memory and profiling tests assert
# what the oneDNN kernels do on every machine; child processes inherit the setting.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
