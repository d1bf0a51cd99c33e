from pathlib import Path

from setuptools import find_packages, setup

# checkmate.tf2: lowering Keras training steps, code generation, RematModel
TF = ["tensorflow>=2.16", "keras>=3.0"]

setup(
    name="checkmate",
    version="0.1.0",
    description="Optimal tensor rematerialization for TensorFlow 2: train models that do not fit in memory",
    long_description=Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["checkmate", "checkmate.*"]),
    package_data={"checkmate": ["data/examples/*.json"]},
    # The core: graphs, solvers, simulation, the command line's solve, sweep and plot. TensorFlow is
    # needed only by checkmate.tf2 and the commands that lower Keras models (extra "tf").
    install_requires=[
        "numpy>=1.24",
        "scipy>=1.10",
        "networkx>=3.1",
        "cvxpy>=1.5",
        "highspy>=1.7",
        "matplotlib>=3.7",
        "tqdm>=4.60",
    ],
    extras_require={
        "tf": TF,
        "gurobi": ["gurobipy>=11.0"],
        "ortools": ["ortools>=9.10"],
        "ray": ["ray>=2.9"],
        "test": TF + [
            "pytest>=8.0",
            "pytest-xdist>=3.5",
            "hypothesis>=6.100",
            "nbclient>=0.10",
            "nbformat>=5.9",
            "ipykernel>=6.29",
            # every backend runs in the test suite: pip's gurobipy carries a size-limited licence that
            # solves the small test models (larger ones are refused with a message naming HiGHS)
            "ortools>=9.10",
            "gurobipy>=11.0",
            # the sweep's Ray executor is tested against a local Ray instance (two CPUs, no dashboard)
            "ray>=2.9",
            # real-model tests: KerasHub tasks at small random-init configurations (no download)
            "keras-hub>=0.32",
        ],
    },
    entry_points={"console_scripts": ["checkmate=checkmate.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
