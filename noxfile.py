"""Sessions for every distribution: build wheels, install them into fresh venvs, test.

    nox -s tests        # wheels of runtime-provider-cpu and runtime-core + the whole test suite
    nox -s opencl       # the OpenCL provider's tests on PoCL, from wheels
    nox -s wheels       # build every distribution's wheel into dist/
    nox -s quickstart   # the README's first Quick start line, in a fresh venv
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

ROOT = Path(__file__).parent
DIST = ROOT / "dist"
DISTRIBUTIONS = {
    "runtime-provider-cpu": ROOT / "providers" / "cpu",
    "runtime-core": ROOT,
    "runtime-provider-opencl": ROOT / "providers" / "opencl",
}
# Test-only dependencies: onnxruntime is an oracle, never a runtime dependency.
# torch 2.13.0 (CPU build) installs from a local file on the project's machines.
TEST_DEPS = [
    "pytest>=8",
    "onnxruntime>=1.20",
    "torch==2.13.0",
    "onnxscript",
    "scikit-learn",
    "skl2onnx",
    "onnxmltools",
    "lightgbm",
    "xgboost",
]

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = False


def build_wheels(session: nox.Session) -> dict[str, Path]:
    """Build one wheel per distribution (real builds, not editable installs)."""
    if DIST.exists():
        shutil.rmtree(DIST)
    DIST.mkdir()
    session.install("build>=1", "setuptools>=68", "wheel")
    wheels = {}
    for name, folder in DISTRIBUTIONS.items():
        session.run("python", "-m", "build", "--wheel", "--no-isolation", "--outdir", str(DIST),
                    str(folder), silent=True)
        prefix = name.replace("-", "_") + "-"
        found = sorted(p for p in DIST.glob("*.whl") if p.name.startswith(prefix))
        if not found:
            session.error(f"no wheel was built for {name}")
        wheels[name] = found[-1]
    return wheels


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every distribution's wheel into dist/."""
    for name, whl in build_wheels(session).items():
        session.log(f"{name}: {whl.name}")


@nox.session
def tests(session: nox.Session) -> None:
    """Install the wheels into a fresh venv and run the whole test suite against them."""
    built = build_wheels(session)
    # opencl with its [pocl] extra: a real CPU OpenCL device from PyPI, so its tests run for real
    # the CPU provider with its [image] extra (Pillow, for ImageDecoder)
    session.install(f"{built['runtime-provider-cpu']}[image]", str(built["runtime-core"]),
                    f"{built['runtime-provider-opencl']}[pocl]")
    session.install(*TEST_DEPS)
    env = {"RUNTIME_CORE_EXPECT_INSTALLED": "1", "RUNTIME_CORE_OPENCL_REQUIRED": "1"}
    # run from the tests folder so the source tree cannot shadow the installed packages
    session.chdir(ROOT / "tests")
    session.run("pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), *session.posargs,
                env=env)


@nox.session
def opencl(session: nox.Session) -> None:
    """runtime-core + cpu + opencl[pocl] wheels in a fresh venv; only the OpenCL tests, on PoCL."""
    built = build_wheels(session)
    session.install(str(built["runtime-provider-cpu"]), str(built["runtime-core"]),
                    f"{built['runtime-provider-opencl']}[pocl]")
    session.install("pytest>=8", "onnxruntime>=1.20")
    session.chdir(ROOT / "tests")
    session.run("pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
                "providers/opencl", *session.posargs,
                env={"RUNTIME_CORE_EXPECT_INSTALLED": "1", "RUNTIME_CORE_OPENCL_REQUIRED": "1"})


@nox.session
def quickstart(session: nox.Session) -> None:
    """What a new user does first: install both distributions, run the bundled sample."""
    session.install(str(DISTRIBUTIONS["runtime-provider-cpu"]), str(ROOT))
    session.chdir(os.path.expanduser("~"))
    session.run("runtime-core", "run", "--sample")
    session.run("runtime-core", "providers")


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark set (benchmarks/models.py) against onnxruntime at 2 threads, on the wheels;
    writes benchmarks/RESULTS.md. Pass model names to run a subset: nox -s bench -- bert_base."""
    built = build_wheels(session)
    session.install(str(built["runtime-provider-cpu"]), str(built["runtime-core"]))
    session.install(*TEST_DEPS)
    session.chdir(ROOT / "benchmarks")  # not the source tree: the installed packages are benched
    session.run("python", str(ROOT / "benchmarks" / "run_all.py"), "--threads", "2",
                "--out", str(ROOT / "benchmarks" / "RESULTS.md"), *session.posargs)
