"""The official ``onnx.backend.test.BackendTest`` run against ``runtime_core.backend``.

An independent run of the same 2033 cases (onnx's own runner, loader and comparison),
in-process; the cases in ``exclusions.txt`` are excluded, everything else must pass.
"""

from __future__ import annotations

import re
import warnings

import onnx.backend.test

import runtime_core.backend as backend
from runtime_core.conformance.exclusions import load_exclusions

warnings.filterwarnings("ignore", category=RuntimeWarning)

_bt = onnx.backend.test.BackendTest(backend, __name__)

for _case in load_exclusions():
    _bt.exclude("^" + re.escape(_case.split("/", 1)[1]) + "_cpu$")

# onnx's runner compares a sequence element-wise by calling itself on each element as if it were a
# list of outputs: len() of the 0-d first element of this case's sequence raises TypeError, for any
# backend (our runner compares it correctly and it passes there: tests/conformance/test_conformance.py)
_bt.exclude(r"^test_loop16_seq_none_cpu$")

globals().update(_bt.test_cases)
