"""Held-out models (``heldout_builder``: a Hugging-Face-style BERT encoder and a ResNet-style
CNN, exported at test time by both exporters with a dynamic batch) on ["opencl", "cpu"]:

* each matches onnxruntime (rtol = atol = 1e-3) over 100 runs at four batch sizes, with at
  least 95% of its heavy nodes (Conv, MatMul, Gemm, norms, Softmax) on OpenCL;
* the BERT export, whose first run corrupted the heap with Debian's PoCL, also runs in guard
  mode (RUNTIME_CORE_OPENCL_GUARD=1: guard zones around every buffer, checked after every
  kernel and copy, new buffers poisoned with NaN).

Every check runs in a child process with glibc's heap checks on (MALLOC_CHECK_=3), so a
heap corruption or a crash fails the test, with the child's output, instead of killing the
test run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opencl_helpers import TEST_PLATFORM, requires_pocl

pytest.importorskip("torch")

pytestmark = requires_pocl
HERE = Path(__file__).resolve().parent
CASES = [(m, e) for m in ("bert", "resnet") for e in ("torchscript", "dynamo")]


def run_child(model, exporter, repeats, guard):
    env = {**os.environ, "MALLOC_CHECK_": "3", "MALLOC_PERTURB_": "165",
           "RUNTIME_CORE_OPENCL_GUARD": "1" if guard else "0"}
    proc = subprocess.run([sys.executable, str(HERE / "heldout_builder.py"), model, exporter, str(repeats),
                           TEST_PLATFORM], capture_output=True, text=True, timeout=900, env=env, cwd=HERE)
    out = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"the child exited with {proc.returncode} (a negative code is a signal):\n{out}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model,exporter", CASES, ids=[f"{m}-{e}" for m, e in CASES])
def test_heldout_model_matches_onnxruntime_over_100_runs(model, exporter):
    res = run_child(model, exporter, 25, guard=False)
    print(json.dumps(res))
    assert res["dynamic_batch"] and res["batches"] == [1, 2, 3, 5]
    assert res["runs"] == 100 and res["max_abs_diff"] <= 1e-3
    assert res["heavy"] > 0 and res["heavy_on_opencl"] >= 0.95 * res["heavy"], res


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_bert_in_guard_mode(exporter):
    res = run_child("bert", exporter, 2, guard=True)
    print(json.dumps(res))
    assert res["guard"] and res["guard_checks"] > 100  # every kernel and copy was checked
    assert res["runs"] == 8 and res["max_abs_diff"] <= 1e-3
