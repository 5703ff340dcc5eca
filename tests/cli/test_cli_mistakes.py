"""Ordinary user mistakes on the command line, through the installed console script: each
gets one ``error: ...`` line naming the file or value and what is wrong, exit status 2, no
traceback, and nothing written."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from oracle import make_model

EXE = shutil.which("runtime-core", path=str(Path(sys.executable).parent)) or shutil.which("runtime-core")


def cli(*args, cwd, env_extra=None):
    assert EXE, "the runtime-core console script is not installed"
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([EXE, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=180)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def one_error(proc, *words):
    """The process failed as a user mistake should: exit 2, one ``error:`` line naming ``words``."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.fixture
def work(tmp_path):
    from onnx import helper

    x = np.zeros((2, 3), np.float32)
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": x}, ["y"])
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    np.save(tmp_path / "good.npy", np.ones((2, 3), np.float32))
    np.savez(tmp_path / "good.npz", x=np.ones((2, 3), np.float32))
    (tmp_path / "not-an-npy-file").write_text("just text\n")
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "garbage.onnx").write_bytes(b"\x08\x07 this is not protobuf")
    return tmp_path


def expect(work, args, *words, env_extra=None):
    before = snapshot(work)
    line = one_error(cli(*args, cwd=work, env_extra=env_extra), *words)
    assert snapshot(work) == before, "a failed command wrote or changed files"
    return line


def test_run_input_missing_file(work):
    expect(work, ["run", "m.onnx", "--input", "x=missing.npy"], "missing.npy", "does not exist")


def test_run_input_not_an_npy_file_says_so_without_pickles(work):
    line = expect(work, ["run", "m.onnx", "--input", "x=not-an-npy-file"], "not-an-npy-file", "not a .npy file")
    assert "pickle" not in line.lower()


def test_run_input_directory(work):
    expect(work, ["run", "m.onnx", "--input", "x=a-directory"], "a-directory", "directory")


def test_run_input_without_name(work):
    expect(work, ["run", "m.onnx", "--input", "good.npy"], "NAME=FILE.npy", "good.npy")


def test_run_input_unknown_name_lists_the_inputs(work):
    expect(work, ["run", "m.onnx", "--input", "nope=good.npy"], "nope", "its inputs: x")


def test_run_save_missing_folder(work):
    expect(work, ["run", "m.onnx", "--save", "missing-dir"], "missing-dir", "does not exist")


@pytest.mark.parametrize("value", ["0", "-1", "ten"])
def test_run_repeat_must_be_positive(work, value):
    expect(work, ["run", "m.onnx", "--repeat", value], "--repeat", value)


def test_optimize_missing_input(work):
    expect(work, ["optimize", "missing.onnx", "out.onnx"], "missing.onnx", "does not exist")


def test_optimize_output_in_missing_folder(work):
    expect(work, ["optimize", "m.onnx", "missing-dir/out.onnx"], "missing-dir", "does not exist")


def test_optimize_refuses_to_overwrite_its_input(work):
    expect(work, ["optimize", "m.onnx", "m.onnx"], "m.onnx", "overwrite")


def test_optimize_invalid_model_leaves_no_output(work):
    expect(work, ["optimize", "garbage.onnx", "out.onnx"], "garbage.onnx")
    assert not (work / "out.onnx").exists()


def test_profile_missing_inputs(work):
    expect(work, ["profile", "m.onnx", "--inputs", "missing.npz"], "missing.npz", "does not exist")


def test_profile_inputs_not_an_npz(work):
    expect(work, ["profile", "m.onnx", "--inputs", "good.npy"], "good.npy", ".npz")


@pytest.mark.parametrize("cmd", ["bench", "profile"])
def test_bench_and_profile_repeat_must_be_positive(work, cmd):
    expect(work, [cmd, "m.onnx", "--repeat", "0"], "--repeat")


def test_check_unavailable_provider_says_nodes_fall_back(work):
    env = {"RUNTIME_CORE_DISABLE_PLUGINS": "opencl"}
    proc = cli("check", "m.onnx", "--providers", "opencl", cwd=work, env_extra=env)
    assert proc.returncode == 0, proc.stderr
    assert "opencl: unavailable, skipped: disabled by RUNTIME_CORE_DISABLE_PLUGINS" in proc.stdout
    assert "fall back to CPUExecutionProvider" in proc.stdout
    assert "runs on CPUExecutionProvider" in proc.stdout
    run = cli("run", "m.onnx", "--providers", "opencl", "--repeat", "1", cwd=work, env_extra=env)
    assert run.returncode == 0, run.stderr
    # run says the same: skipped, for the same reason, and runs on the CPU
    assert "'opencl' is unavailable and is skipped" in run.stderr
    assert "RUNTIME_CORE_DISABLE_PLUGINS" in run.stderr
    assert "CPUExecutionProvider" in run.stdout


def test_unknown_provider_option_is_refused_with_the_known_ones(work):
    import runtime_core as rt
    from runtime_core.errors import ProviderOptionsError

    if "OpenCLExecutionProvider" not in rt.get_available_providers():
        pytest.skip("no OpenCL device here (the option check needs the provider to be created)")
    with pytest.raises(ProviderOptionsError, match="known: platform, device"):
        rt.InferenceSession(str(work / "m.onnx"), providers=[("opencl", {"devcie": "0"})])


def test_allow_list_naming_nothing_installed_is_warned_about(work):
    proc = cli("providers", cwd=work, env_extra={"RUNTIME_CORE_PLUGINS": "openlc"})
    assert proc.returncode == 0, proc.stderr
    assert "openlc" in proc.stderr and "no installed plugin" in proc.stderr
    assert "not in RUNTIME_CORE_PLUGINS" in proc.stdout


def test_profile_warms_up_before_it_counts(work):
    import json

    proc = cli("profile", "m.onnx", "--repeat", "3", "--prefix", str(work / "p"), "--json", cwd=work)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["runs"] == 3  # the summary counts the timed runs only
    assert [(op, n) for op, _, n, _ in summary["by_op"]] == [("Relu", 3)]  # warm-up's node left out
    with open(summary["file"]) as f:
        runs = [e for e in json.load(f) if e.get("name") == "model_run"]
    assert len(runs) == 4  # the trace keeps the warm-up run, as onnxruntime's would


# -- every subcommand, with missing, unreadable and malformed files and values -------------

def _walk_cases(work):
    (work / "unreadable.onnx").write_bytes((work / "m.onnx").read_bytes())
    os.chmod(work / "unreadable.onnx", 0)
    (work / "bad.json").write_text("{not json")
    (work / "obj.json").write_text('{"a": 1}')
    np.save(work / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    models = ["missing.onnx", "unreadable.onnx", "garbage.onnx", "a-directory", "not-an-npy-file"]
    if os.access(work / "unreadable.onnx", os.R_OK):  # root reads it anyway: not a mistake then
        models.remove("unreadable.onnx")
    cases = []
    for m in models:
        cases += [["run", m], ["partition", m], ["check", m], ["optimize", m, "out.onnx"],
                  ["bench", m, "--no-memory", "--repeat", "1"], ["profile", m, "--repeat", "1"]]
    for f in ["missing.npy", "not-an-npy-file", "a-directory", "obj.npy", "good.npz", "garbage.onnx"]:
        cases.append(["run", "m.onnx", "--input", f"x={f}"])
    for f in ["missing.npz", "not-an-npy-file", "a-directory", "good.npy", "garbage.onnx"]:
        cases += [["profile", "m.onnx", "--inputs", f], ["bench", "m.onnx", "--inputs", f, "--no-memory"]]
    cases += [["profile", "bad.json"], ["profile", "obj.json"], ["profile", "missing.json"]]
    for flag, value in [("--repeat", "0"), ("--repeat", "x"), ("--threads", "-1"), ("--dim", "-2")]:
        cases += [["run", "m.onnx", flag, value], ["profile", "m.onnx", flag, value]]
    cases += [["bench", "m.onnx", "--warmup", "-1"], ["bench", "m.onnx", "--min-time", "nan"],
              ["bench", "m.onnx", "--compare", "tensorflow"], ["bench", "m.onnx", "--level", "5"],
              ["partition", "m.onnx", "--threads", "many"], ["optimize", "m.onnx", "a-directory"],
              ["optimize", "m.onnx", "out.onnx", "--level", "max"],
              ["conformance", "--folders", "nope"], ["conformance", "-k", "("],
              ["conformance", "--json", "missing-dir/r.json", "-k", "test_abs$"], ["conformance", "--jobs", "-1"],
              ["new-provider", "cpu", "-o", "np"], ["new-provider", "Bad Name!", "-o", "np2"],
              ["run", "m.onnx", "--sample"], ["nonsense"], ["run", "m.onnx", "--unknown-flag"]]
    return cases


def _main_in_process(args, cwd, capsys):
    """``runtime_core.cli.main`` in this process (the walk has ~90 cases; a process each would
    take minutes): exit status and stderr, any exception escaping ``main`` is a traceback."""
    from runtime_core.cli import main

    old = os.getcwd()
    os.chdir(cwd)
    try:
        try:
            rc = main(list(args))
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # noqa: BLE001 - what a user would see as a traceback
            return None, f"Traceback: {type(exc).__name__}: {exc}"
    finally:
        os.chdir(old)
    return rc, capsys.readouterr().err


def test_every_subcommand_answers_mistakes_without_a_traceback(work, capsys):
    failures = []
    for args in _walk_cases(work):
        before = snapshot(work)
        rc, err = _main_in_process(args, work, capsys)
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
        if "Traceback" in err or rc != 2 or len(lines) != 1 or not lines[0].startswith("error: "):
            failures.append(f"{' '.join(args)}: exit {rc}: {err[-400:]}")
        if snapshot(work) != before:
            failures.append(f"{' '.join(args)}: wrote files")
    assert not failures, "\n".join(failures)
