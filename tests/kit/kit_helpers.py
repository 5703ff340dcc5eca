"""Helpers of the kit's tests (a module name unique in the suite): subprocess pytest and pip."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

SITE = Path(__file__).parent / "fixtures" / "site"
#: the good fixture provider's cases: full (add, mul, relu), partial (mish, celu, prelu), chains
CASES = r"^node/test_(add|mul|relu|mish_expanded|celu_expanded|prelu_example_expanded)$"


def kit_plugin_args() -> list[str]:
    """``-p runtime_core.testing.plugin`` unless runtime-core's pytest11 entry point is installed."""
    installed = any(ep.name == "runtime_core" for ep in metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "runtime_core.testing.plugin"]


def run_pytest(args, cwd, pythonpath=(), timeout=300):
    """Run pytest in a subprocess (this interpreter), with extra sys.path entries."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *kit_plugin_args(), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def pip_install_target(package_dir: Path, target: Path) -> None:
    """``pip install --target`` a local package without dependencies or build isolation."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(target), str(package_dir)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"pip install {package_dir} failed:\n{proc.stdout}\n{proc.stderr}"
