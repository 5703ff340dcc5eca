"""Typical onnxruntime user scripts (``scripts/``), each run twice in its own process: with
onnxruntime, which shows the script is a correct onnxruntime script, and with runtime_core
substituted for onnxruntime through ``tests/shim`` (``import onnxruntime`` gives runtime_core),
unchanged. Each script checks its own results (numpy, scikit-learn or torch references)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SHIM = HERE.parent / "shim"
SCRIPTS = sorted((HERE / "scripts").glob("s*.py"))

#: scripts that use what runtime-core does not have yet, each with what is missing
NOT_BUILT: dict[str, str] = {}


def start_script(path: Path, shim: bool) -> subprocess.Popen:
    env = dict(os.environ)
    if shim:
        env["PYTHONPATH"] = os.pathsep.join([str(SHIM), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=str(path.parent))


def finish_script(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += "\n[killed after 600 s]"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_shim_substitutes_runtime_core():
    env = dict(os.environ, PYTHONPATH=str(SHIM))
    code = ("import onnxruntime, runtime_core; "
            "from onnxruntime.capi.onnxruntime_pybind11_state import Fail; "
            "import runtime_core.capi.onnxruntime_pybind11_state as s; "
            "import onnxruntime.errors; "
            "assert onnxruntime.InferenceSession is runtime_core.InferenceSession and Fail is s.Fail; "
            "assert onnxruntime.errors is runtime_core.errors and s.__spec__.name == s.__name__; "
            "assert onnxruntime.__file__.startswith(sys.argv[1]); print('shim ok')")
    proc = subprocess.run([sys.executable, "-c", "import sys; " + code, str(SHIM)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "shim ok" in proc.stdout, proc.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_onnxruntime_script_runs_unchanged(script):
    pytest.importorskip("onnxruntime")  # the oracle: the script must be right for onnxruntime
    # both runs at once, each in its own process (most of a run is its imports, on one core);
    # each script writes only under its own tempfile.mkdtemp()
    theirs_proc, ours_proc = start_script(script, shim=False), start_script(script, shim=True)
    theirs, ours = finish_script(theirs_proc), finish_script(ours_proc)
    assert theirs.returncode == 0 and theirs.stdout.rstrip().endswith("ok"), \
        f"the script fails with onnxruntime itself:\n{theirs.stderr[-3000:]}"
    passed = ours.returncode == 0 and ours.stdout.rstrip().endswith("ok")
    if script.name in NOT_BUILT:
        assert not passed, f"{script.name} now runs on runtime_core: remove it from NOT_BUILT"
        pytest.xfail(NOT_BUILT[script.name])
    assert passed, ours.stderr[-3000:]
