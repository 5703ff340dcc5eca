"""Run a converter library's own test suite twice, with onnxruntime and with ``import onnxruntime``
resolved to runtime_core (the shim in ``tests/shim``), and compare the per-test outcomes.

    python tests/compat/compare_suite.py --sdist skl2onnx==1.20.0 --work /tmp/suite
    python tests/compat/compare_suite.py --tests /path/to/src --pytest-args tests/xgboost

Prints both pass counts and every test that passes with onnxruntime but not with runtime-core
(with the first line of its failure), and the other way round. Needs network for ``--sdist``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

SHIM = Path(__file__).resolve().parents[1] / "shim"


def download_sdist(spec: str, work: Path) -> Path:
    """``pip download`` the sdist of ``spec`` into ``work`` and unpack it; returns its folder."""
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", spec,
                    "-d", str(work)], check=True)
    name = spec.split("==")[0].replace("-", "_")
    archives = sorted(p for p in work.glob("*.tar.gz") if p.name.lower().replace("-", "_").startswith(name))
    if not archives:
        raise SystemExit(f"no sdist of {spec} in {work}")
    with tarfile.open(archives[-1]) as tar:
        tar.extractall(work, filter="data")
    return work / archives[-1].name[:-len(".tar.gz")]


def run_pytest(src: Path, junit: Path, shim: bool, pytest_args: list[str], timeout: int) -> None:
    env = dict(os.environ)
    if shim:
        env["PYTHONPATH"] = os.pathsep.join([str(SHIM), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
           "-o", "junit_family=xunit1", *pytest_args]
    try:
        subprocess.run(cmd, cwd=src, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"pytest timed out after {timeout} s ({'shim' if shim else 'onnxruntime'})", file=sys.stderr)


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test id -> (passed | failed | skipped, first line of the message)."""
    out: dict[str, tuple[str, str]] = {}
    if not junit.exists():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        tid = f"{case.get('file') or case.get('classname')}::{case.get('classname')}::{case.get('name')}"
        state, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                state = "skipped" if tag == "skipped" else "failed"
                msg = (el.get("message") or el.text or "").strip().splitlines()[:1]
                msg = msg[0][:300] if msg else ""
                break
        if tid in out and out[tid][0] == "failed":
            continue  # a teardown error after a pass counts as a failure
        out[tid] = (state, msg)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", help="pip requirement whose sdist holds the suite, e.g. skl2onnx==1.20.0")
    ap.add_argument("--tests", type=Path, help="an unpacked source tree instead of --sdist")
    ap.add_argument("--work", type=Path, default=Path("build/compat"))
    ap.add_argument("--pytest-args", nargs="*", default=["tests"])
    ap.add_argument("--arg", action="append", default=[], dest="extra",
                    help="one more pytest argument for both runs (repeat: --arg=-k --arg='not slow')")
    ap.add_argument("--ours-args", action="append", default=[],
                    help="extra pytest arguments for the runtime-core run only (e.g. -k 'not ...' for tests "
                         "known to take the process down: they are reported as missing)")
    ap.add_argument("--timeout", type=int, default=4 * 3600, help="seconds per pytest run")
    ap.add_argument("--only", choices=["onnxruntime", "runtime-core"], help="run one side (reuse the other's XML)")
    ap.add_argument("--merge", action="append", type=Path, default=[],
                    help="compare the XML files already in these work folders (runs split in parts); runs nothing")
    args = ap.parse_args(argv)
    if args.merge:
        ref, ours = {}, {}
        for d in args.merge:
            ref.update(outcomes(d / "onnxruntime.xml"))
            ours.update(outcomes(d / "runtime_core.xml"))
        report(ref, ours)
        return 0
    work = args.work.resolve()
    src = args.tests.resolve() if args.tests else download_sdist(args.sdist, work)
    work.mkdir(parents=True, exist_ok=True)
    ref_xml, our_xml = work / "onnxruntime.xml", work / "runtime_core.xml"
    if args.only != "runtime-core":
        run_pytest(src, ref_xml, False, args.pytest_args + args.extra, args.timeout)
    if args.only != "onnxruntime":
        run_pytest(src, our_xml, True, args.pytest_args + args.extra + args.ours_args, args.timeout)
    report(outcomes(ref_xml), outcomes(our_xml))
    return 0


def report(ref: dict, ours: dict) -> None:
    """Print both pass counts and the tests whose outcome differs."""
    n_ref = sum(s == "passed" for s, _ in ref.values())
    n_ours = sum(s == "passed" for s, _ in ours.values())
    print(f"\ntests: {len(ref)} (onnxruntime run), {len(ours)} (runtime-core run)")
    print(f"onnxruntime passes {n_ref}, runtime-core passes {n_ours}")
    worse = sorted(t for t, (s, _) in ref.items() if s == "passed" and ours.get(t, ("missing", ""))[0] != "passed")
    better = sorted(t for t, (s, _) in ours.items() if s == "passed" and ref.get(t, ("missing", ""))[0] != "passed")
    print(f"\npass with onnxruntime, not with runtime-core: {len(worse)}")
    for t in worse:
        print(f"  {t}\n      {ours.get(t, ('missing', ''))[1]}")
    print(f"\npass with runtime-core, not with onnxruntime: {len(better)}")
    for t in better:
        print(f"  {t}\n      {ref.get(t, ('missing', ''))[1]}")


if __name__ == "__main__":
    sys.exit(main())
