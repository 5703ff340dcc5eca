"""Every machine-path module (fast/) imports as the first one: fast/ and the ops package import
each other, and a cycle shows only when a module starts it."""

import subprocess
import sys
from pathlib import Path

import runtime_provider_cpu

PKG = Path(runtime_provider_cpu.__file__).parent

# in one child: for each module, forget the package's Python modules (the compiled extension is
# kept: it cannot be initialised twice) and import that module first
SCRIPT = r"""
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for m in [m for m in sys.modules if m.startswith("runtime_provider_cpu") and not m.endswith("_native")]:
        del sys.modules[m]
    try:
        importlib.import_module(name)
    except Exception as e:
        failed.append(f"{name}: {type(e).__name__}: {e}")
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


def _modules() -> list[str]:
    names = []
    for path in sorted((PKG / "fast").glob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_fast_module_imports_first():
    names = _modules()
    assert "runtime_provider_cpu.fast.conv" in names and "runtime_provider_cpu.fast.im2col" in names
    out = subprocess.run([sys.executable, "-c", SCRIPT, *names], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
