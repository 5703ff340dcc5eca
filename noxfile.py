"""Sessions for every distribution: build wheels, install them into fresh venvs, test.

    nox -s tests        # wheels of runtime-provider-cpu and runtime-core + the whole test suite
    nox -s opencl       # the OpenCL provider's tests on PyPI's and on Debian's PoCL, from wheels
    nox -s wheels       # build every distribution's wheel into dist/
    nox -s quickstart   # the README's first Quick start line, in a fresh venv
    nox -s example      # the example provider (examples/runtime-provider-numexpr): its tests + the kit
    nox -s scaffold     # runtime-core new-provider acme, pip install it, run its tests
    nox -s lint         # ruff (rules in pyproject.toml) + mypy on the public modules
    nox -s fuzz         # seeded, time-bounded fuzzing from the wheels (-- --seed N --seconds S)
    nox -s lowest       # the wheels with every dependency at its declared lower bound: tests + conformance
    nox -s nonative     # the model tests and the CPU provider's tests with its compiled kernels disabled
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
DIST = ROOT / "dist"
DISTRIBUTIONS = {
    "runtime-provider-cpu": ROOT / "providers" / "cpu",
    "runtime-core": ROOT,
    "runtime-provider-opencl": ROOT / "providers" / "opencl",
    "runtime-provider-cuda": ROOT / "providers" / "cuda",
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
# the serving tests' real clients (tests/serving): Triton's HTTP client, and Selenium to drive the
# system's headless Chromium (Debian packages chromium and chromium-driver); the tests session only,
# so the lowest session's pins never meet them
SERVE_TEST_DEPS = ["tritonclient[http]>=2.40", "selenium>=4.11"]

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = False


def frees_venv_under_ci(func):
    """Under CI (``CI`` set), remove the session's venv once the session ends, passed or failed.
    ``.ci/run`` runs six sessions one after another; their venvs (torch, onnxruntime, Ray: 2-3 GB
    each for tests, lowest and nonative) would otherwise all stay on disk until the end, and a
    CI machine with little free disk then fails the later sessions' installs (it did once: "No
    space left on device" in scaffold and lint). One venv at a time is all CI needs."""
    import functools

    @functools.wraps(func)
    def wrapper(session: nox.Session, *args, **kwargs):
        try:
            return func(session, *args, **kwargs)
        finally:
            location = getattr(session.virtualenv, "location", None)
            if os.environ.get("CI") and location and Path(location).is_dir():
                shutil.rmtree(location, ignore_errors=True)

    return wrapper


#: dist/'s record of what its wheels were built from: {"key": source_key(), "wheels": {name: file}}
WHEELS_MANIFEST = DIST / "wheels.json"


def source_key() -> str | None:
    """A digest of everything a wheel is built from: the content of every file git would carry
    (tracked, and untracked but not ignored: an edit not yet committed counts), the interpreter
    and the build's environment switch (RUNTIME_CORE_NATIVE_ISA). None outside a git checkout:
    then nothing is reused across nox runs."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    digest = hashlib.sha256()
    digest.update(f"{sys.implementation.cache_tag} {sys.platform} "
                  f"{os.environ.get('RUNTIME_CORE_NATIVE_ISA', '')}".encode())
    for rel in sorted(set(listed.split(b"\0")) - {b""}):
        path = ROOT / os.fsdecode(rel)
        if path.is_file():  # a tracked file deleted in the working tree is not built from
            digest.update(rel + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _reusable_wheels(key: str | None) -> dict[str, Path] | None:
    """dist/'s wheels where dist/wheels.json says they were built from ``key``, else None."""
    if key is None or not WHEELS_MANIFEST.is_file():
        return None
    try:
        manifest = json.loads(WHEELS_MANIFEST.read_text(encoding="utf-8"))
    except ValueError:
        return None
    names = manifest.get("wheels", {})
    if manifest.get("key") != key or set(names) != set(DISTRIBUTIONS):
        return None
    wheels = {name: DIST / names[name] for name in DISTRIBUTIONS}
    return wheels if all(whl.is_file() for whl in wheels.values()) else None


def build_wheels(session: nox.Session) -> dict[str, Path]:
    """One wheel per distribution (real builds, not editable installs), built once per source
    tree: a session finds the wheels that an earlier session (of this nox run or an earlier one)
    built from the same content in dist/ and installs those (``.ci/run``'s six sessions built all
    four each; after the first, setuptools reused the C objects in providers/cpu/build/, so each
    later build was a venv install of the build tools and four packagings, ~20 s). Any change to
    a file git carries, or to the interpreter, rebuilds all four."""
    key = source_key()
    reused = _reusable_wheels(key)
    if reused is not None:
        session.log(f"reusing the wheels in {DIST} (built from this source tree, key {key[:12]})")
        return reused
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
    if key is not None:
        WHEELS_MANIFEST.write_text(json.dumps({"key": key, "wheels": {n: w.name for n, w in wheels.items()}}),
                                   encoding="utf-8")
    return wheels


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every distribution's wheel into dist/."""
    for name, whl in build_wheels(session).items():
        session.log(f"{name}: {whl.name}")


@nox.session
@frees_venv_under_ci
def tests(session: nox.Session) -> None:
    """Install the wheels into a fresh venv and run the whole test suite against them."""
    built = build_wheels(session)
    # opencl with its [pocl] extra: a real CPU OpenCL device from PyPI, so its tests run for real
    # the CPU provider with its [image] extra (Pillow, for ImageDecoder)
    session.install(f"{built['runtime-provider-cpu']}[image]", f"{built['runtime-core']}[serve,ray]",
                    f"{built['runtime-provider-opencl']}[pocl]", str(built["runtime-provider-cuda"]))
    session.install(*TEST_DEPS, *SERVE_TEST_DEPS)
    env = {"RUNTIME_CORE_EXPECT_INSTALLED": "1", "RUNTIME_CORE_OPENCL_REQUIRED": "1"}
    # run from the tests folder so the source tree cannot shadow the installed packages
    session.chdir(ROOT / "tests")
    session.run("pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), *session.posargs,
                env=env)


#: the PoCL each ``opencl`` session loads, through the ICD loader's OCL_ICD_VENDORS (one ICD
#: file: only that driver is loaded): PyPI's (bundled in the pyopencl wheel, with the [pocl]
#: extra) and Debian's (``apt-get install pocl-opencl-icd``)
POCL_ICDS = {"pypi": None, "debian": "/etc/OpenCL/vendors/pocl.icd"}
#: the extras the lowest session installs (their requirements are pinned to their lower bounds too)
LOWEST_EXTRAS = {"runtime-provider-cpu": ("image",), "runtime-provider-opencl": ("pocl",)}
#: what the lowest session runs: the whole conformance suite and a representative subset of the rest
#: (the model tests run in the tests session; here the torch exports, with onnxruntime at numpy 1.x)
LOWEST_TESTS = ["conformance", "core", "providers/cpu", "providers/opencl", "plugins", "cli",
                "models/test_torch_models.py"]
#: ... less the tests marked ``kernel`` (pyproject.toml): each calls one compiled kernel directly
#: (runtime_provider_cpu._native, no session) with arrays made by the test and compares with a
#: float64 / numpy reference. The C side takes buffers through the buffer protocol (no numpy
#: headers), so what the lower bounds could change is the Python glue around the kernels (packing,
#: the policy's choices, the sgemm bridge's SciPy): the op, session and model tests that stay here
#: run those kernels through that glue. The kernel grids themselves run in the tests session.
LOWEST_MARKERS = "not kernel"


def lowest_pins() -> list[str]:
    """``name==X`` for each ``name>=X`` that our distributions (and LOWEST_EXTRAS) declare, the
    highest X where several declare the same name; our own distributions are installed as wheels."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    ours = {canonicalize_name(n) for n in DISTRIBUTIONS}
    low: dict[str, str] = {}
    for name, folder in DISTRIBUTIONS.items():
        project = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        lines = list(project.get("dependencies", []))
        for extra in LOWEST_EXTRAS.get(name, ()):
            lines += project.get("optional-dependencies", {}).get(extra, [])
        for line in lines:
            req = Requirement(line)
            dep = canonicalize_name(req.name)
            bounds = [s.version for s in req.specifier if s.operator == ">="]
            if dep in ours or not bounds:
                continue
            v = max(bounds, key=Version)
            if dep not in low or Version(v) > Version(low[dep]):
                low[dep] = v
    return [f"{dep}=={v}" for dep, v in sorted(low.items())]


@nox.session
@frees_venv_under_ci
def lowest(session: nox.Session) -> None:
    """The wheels with each dependency at its declared lower bound (pins made by lowest_pins from
    the pyproject files; the test tools resolve against them), then LOWEST_TESTS."""
    built = build_wheels(session)
    pins = lowest_pins()
    constraints = Path(session.create_tmp()).resolve() / "lowest-constraints.txt"
    constraints.write_text("\n".join(pins) + "\n", encoding="utf-8")
    session.log("lower bounds: " + " ".join(pins))
    session.install("-c", str(constraints),
                    f"{built['runtime-provider-cpu']}[image]", str(built["runtime-core"]),
                    f"{built['runtime-provider-opencl']}[pocl]", str(built["runtime-provider-cuda"]),
                    *TEST_DEPS)
    # fail here, not in a test, if pip did not install exactly the lower bounds
    session.run("python", "-c", "import sys; from importlib.metadata import version; "
                "from packaging.version import Version as V; "
                "pins = [p.split('==') for p in sys.argv[1:]]; "
                "bad = [f'{n} {version(n)} != {v}' for n, v in pins if V(version(n)) != V(v)]; "
                "print('installed at the lower bounds:', ', '.join(f'{n} {version(n)}' for n, _ in pins)); "
                "sys.exit('; '.join(bad) or None)", *pins)
    session.chdir(ROOT / "tests")
    session.run("pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-m", LOWEST_MARKERS,
                *LOWEST_TESTS, *session.posargs, env={"RUNTIME_CORE_EXPECT_INSTALLED": "1", "RUNTIME_CORE_OPENCL_REQUIRED": "1"})


#: what the nonative session runs: the model tests (issue: "CI runs the model tests once with the extension disabled"); the CPU
#: provider's op tests too with ``nox -s nonative -- providers/cpu`` (about half an hour on 2 cores)
NONATIVE_TESTS = ["models"]


@nox.session
@frees_venv_under_ci
def nonative(session: nox.Session) -> None:
    """The wheels with the CPU provider's compiled kernels disabled (``RUNTIME_CORE_CPU_NATIVE=0``:
    the provider behaves as where ``_native`` cannot be built: no C compiler, aarch64, macOS
    clang, Windows), so every op runs on its numpy path; then NONATIVE_TESTS."""
    built = build_wheels(session)
    session.install(f"{built['runtime-provider-cpu']}[image]", str(built["runtime-core"]))
    session.install(*TEST_DEPS)
    session.run("python", "-c", "from runtime_provider_cpu.fast import policy; "
                "assert policy.NATIVE is None, 'the compiled kernels are still in use'",
                env={"RUNTIME_CORE_CPU_NATIVE": "0"})
    session.chdir(ROOT / "tests")
    session.run("pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), *NONATIVE_TESTS,
                *session.posargs, env={"RUNTIME_CORE_EXPECT_INSTALLED": "1", "RUNTIME_CORE_CPU_NATIVE": "0"})


@nox.session
@nox.parametrize("pocl", list(POCL_ICDS))
def opencl(session: nox.Session, pocl: str) -> None:
    """runtime-core + cpu + opencl[pocl] wheels in a fresh venv; only the OpenCL tests, once per
    PoCL (``nox -s "opencl(pocl='debian')"`` for one). A PoCL that is not installed, or whose
    compiler cannot target this CPU, skips its session with the reason."""
    built = build_wheels(session)
    session.install(str(built["runtime-provider-cpu"]), str(built["runtime-core"]),
                    f"{built['runtime-provider-opencl']}[pocl]")
    session.install(*TEST_DEPS)  # the model tests export torch models; onnxruntime is the oracle
    icd = POCL_ICDS[pocl]
    if icd is None:  # the wheel's own ICD file
        icd = session.run("python", "-c", "import glob, importlib.util, os; print(sorted(glob.glob(os.path.join("
                          "os.path.dirname(importlib.util.find_spec('pyopencl').origin), '.libs', '*.icd')))[0])",
                          silent=True).strip().splitlines()[-1]
    if not os.path.exists(icd):
        session.skip(f"{pocl} PoCL is not installed ({icd} is missing)")
    env = {"RUNTIME_CORE_EXPECT_INSTALLED": "1", "RUNTIME_CORE_OPENCL_REQUIRED": "1", "OCL_ICD_VENDORS": icd}
    why = session.run("python", "-c", "from runtime_provider_opencl.plugin import OpenCLExecutionProvider as P; "
                      "r = P.probe(); print('OK ' + r.reason if r.available else 'NO ' + r.reason)",
                      silent=True, env=env).strip().splitlines()[-1]
    if not why.startswith("OK "):
        session.skip(f"{pocl} PoCL has no usable device here: {why[3:]}")
    session.log(f"{pocl} PoCL: {why[3:]}")
    session.chdir(ROOT / "tests")
    session.run("pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
                "providers/opencl", *session.posargs, env=env)


@nox.session
def quickstart(session: nox.Session) -> None:
    """What a new user does first: install both distributions, run the bundled sample."""
    session.install(str(DISTRIBUTIONS["runtime-provider-cpu"]), str(ROOT))
    session.chdir(os.path.expanduser("~"))
    session.run("runtime-core", "run", "--sample")
    session.run("runtime-core", "providers")


EXAMPLE = ROOT / "examples" / "runtime-provider-numexpr"


@nox.session
@frees_venv_under_ci
def example(session: nox.Session) -> None:
    """The example provider's wheel + runtime-core wheels in a fresh venv: its tests, then the kit."""
    built = build_wheels(session)
    session.install("build>=1", "setuptools>=68", "wheel")  # build_wheels may have reused dist/'s wheels
    session.run("python", "-m", "build", "--wheel", "--no-isolation", "--outdir", str(DIST), str(EXAMPLE),
                silent=True)
    found = sorted(DIST.glob("runtime_provider_numexpr-*.whl"))
    if not found:
        session.error("no wheel was built for runtime-provider-numexpr")
    session.install(str(built["runtime-provider-cpu"]), str(built["runtime-core"]), str(found[-1]))
    session.install("pytest>=8")
    # the tests run on a copy, away from the source folder, so only the installed wheel is importable
    work = Path(session.create_tmp()).resolve() / "example-tests"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(EXAMPLE / "tests", work / "tests")
    session.chdir(work)
    session.run("python", "-c", "import runtime_provider_numexpr as m, runtime_core as c; "
                "assert 'site-packages' in m.__file__ and 'site-packages' in c.__file__, (m.__file__, c.__file__)")
    session.run("pytest", "-p", "no:cacheprovider", "tests", *session.posargs)
    # the kit alone, through the pytest plugin that runtime-core's wheel registers (an empty
    # folder is collected besides the kit's suite, so the kit is all that runs)
    (work / "kit-only").mkdir()
    session.run("pytest", "-p", "no:cacheprovider", "--runtime-provider", "numexpr",
                "--runtime-provider-option", "min_elements=0",
                "--runtime-provider-option", "transcendentals=always", str(work / "kit-only"))


@nox.session
@frees_venv_under_ci
def scaffold(session: nox.Session) -> None:
    """``runtime-core new-provider acme`` from the wheels; pip-install the package; run its tests."""
    built = build_wheels(session)
    session.install(str(built["runtime-provider-cpu"]), str(built["runtime-core"]))
    session.install("pytest>=8")
    work = Path(session.create_tmp()).resolve()
    out = work / "runtime-provider-acme"
    if out.exists():
        shutil.rmtree(out)
    session.chdir(work)
    session.run("runtime-core", "new-provider", "acme", "--output", str(out))
    session.install(str(out))  # a real (wheel) install, as a user of the generated package would
    session.run("runtime-core", "providers")
    session.run("pytest", "-p", "no:cacheprovider", str(out / "tests"), *session.posargs)


@nox.session
@frees_venv_under_ci
def lint(session: nox.Session) -> None:
    """ruff over every Python file (the rule set is in pyproject.toml: errors, not style) and
    mypy over the public modules listed in pyproject.toml's [tool.mypy]."""
    session.install("ruff>=0.5,<1", "mypy>=1.10", "numpy>=1.24", "onnx>=1.16", "pluggy>=1.3", "packaging>=23")
    session.run("ruff", "check", "runtime_core", "providers", "tests", "examples", "benchmarks", "noxfile.py")
    session.run("mypy")


@nox.session
def fuzz(session: nox.Session) -> None:
    """runtime_core.testing.fuzz from the wheels: single-op models aimed at the kernels and mutated
    backend node tests, in one memory-limited worker child per CPU; 600 s and a fresh seed unless
    posargs say otherwise (``nox -s fuzz -- --seed 7 --seconds 60``). Crashes, hangs and untyped
    errors get a reproducer in fuzz-findings/; the session fails if there are any."""
    built = build_wheels(session)
    session.install(str(built["runtime-provider-cpu"]), str(built["runtime-core"]))
    args = list(session.posargs)
    if not any(a.startswith("--seconds") for a in args):
        args += ["--seconds", "600"]
    if not any(a.startswith("--jobs") for a in args):
        args += ["--jobs", str(os.cpu_count() or 1)]
    if not any(a.startswith("--out") for a in args):
        args += ["--out", str(ROOT / "fuzz-findings")]
    session.chdir(session.create_tmp())  # not the source tree: the installed packages are fuzzed
    session.run("python", "-m", "runtime_core.testing.fuzz", *args)


def _bench_cache() -> str:
    return os.environ.get("RUNTIME_CORE_BENCH_CACHE", str(Path.home() / ".cache" / "runtime-core-bench"))


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark corpus (benchmarks/corpus, both halves) against onnxruntime at 2 threads by the
    protocol of ``runtime-core bench --compare onnxruntime`` (each runtime alone in a fresh process
    per round, default settings, OpenBLAS pins removed), on the wheels; the report also goes to
    benchmarks/RESULTS-corpus.txt. Arguments replace ``--corpus all``:
    ``nox -s bench -- --corpus report --rounds 5``. The older set: ``python benchmarks/run_all.py``."""
    built = build_wheels(session)
    session.install(str(built["runtime-provider-cpu"]), str(built["runtime-core"]))
    session.install(*TEST_DEPS)
    session.chdir(session.create_tmp())  # not the source tree: the installed packages are benched
    session.run("runtime-core", "bench", "--compare", "onnxruntime", "--threads", "2",
                "--cache", str(Path(_bench_cache()) / "corpus"), "--corpus-path", str(ROOT / "benchmarks" / "corpus"),
                "--out", str(ROOT / "benchmarks" / "RESULTS-corpus.txt"), *(session.posargs or ["--corpus", "all"]))


@nox.session
def corpus_check(session: nox.Session) -> None:
    """Every corpus builder at its benchmark size: exported, loaded in onnxruntime and in
    runtime-core, outputs compared (not in CI: the exports alone take many minutes on 2 cores).
    ``nox -s corpus_check -- --size tiny`` is the quick pass; model names check only those."""
    built = build_wheels(session)
    session.install(str(built["runtime-provider-cpu"]), str(built["runtime-core"]))
    session.install(*TEST_DEPS)
    session.chdir(ROOT / "benchmarks")  # `python -m corpus`; runtime_core comes from the wheel
    session.run("python", "-m", "corpus", "check", "--cache", str(Path(_bench_cache()) / "corpus"),
                *session.posargs)


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """On a CUDA machine (no network): install our distributions into the current python
    (cupy preinstalled) without dependencies, then tests + conformance [cuda,cpu] + BERT-base b8
    benchmark; the summary goes to $OUT (or the working folder). RUNTIME_CORE_WHEELS=folder
    installs carried wheels instead of building from the tree."""
    wheels = os.environ.get("RUNTIME_CORE_WHEELS")
    pip = ["python", "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
    if wheels:
        session.run(*pip, *sorted(str(p) for p in Path(wheels).glob("runtime_*.whl")))
    else:
        session.run(*pip, *(str(DISTRIBUTIONS[n]) for n in
                            ("runtime-provider-cpu", "runtime-core", "runtime-provider-cuda")))
    env = {"RUNTIME_CORE_CUDA_REQUIRED": "1"}
    session.run("python", str(ROOT / "providers" / "cuda" / "scripts" / "gpu_check.py"), env=env)


@nox.session(venv_backend="none")
def skl2onnx(session: nox.Session) -> None:
    """skl2onnx 1.20.0's own test suite, from its sdist, run with onnxruntime and with runtime-core
    behind ``tests/shim``; prints both pass counts and the tests whose outcome
    differs. Long (the two runs take about 10 minutes on 2 cores), so not in the default run. Runs in the current
    environment: onnxruntime, runtime-core, scikit-learn and the suite's deps (pandas) installed.
    Arguments go to tests/compat/compare_suite.py: ``-- --arg=-k --arg="not issue_789"`` leaves out the two
    tests whose scikit-learn fit (a 7500-sample Gaussian process) takes over half an hour on a loaded
    machine; ``--ours-args`` adds pytest arguments to the runtime-core run only."""
    work = Path(session.create_tmp()).resolve() / "skl2onnx"
    session.run("python", str(ROOT / "tests" / "compat" / "compare_suite.py"), "--sdist", "skl2onnx==1.20.0",
                "--work", str(work), *session.posargs)

