"""The third-party provider kit (runtime_core.testing) run against the OpenCL provider, as a
provider author would run it: ``pytest --runtime-provider opencl``."""

from __future__ import annotations

import subprocess
import sys

from opencl_helpers import TEST_PLATFORM, requires_pocl


@requires_pocl
def test_the_provider_kit_passes_on_opencl(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--runtime-provider", "opencl", "--runtime-provider-option", f"platform={TEST_PLATFORM}",
                           str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for kind in ("claimed cases", "partial cases (CPU fallback)", "fallback chains"):
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(kind))
        assert " 0 failed" in line and " 0 run" not in line, line
