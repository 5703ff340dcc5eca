"""The ONNX backend suite with providers [opencl, cpu]: as many cases pass as on CPU alone
(every case outside exclusions.txt), and every case OpenCL claims entirely passes."""

from __future__ import annotations

import os

from opencl_helpers import OCL, TEST_PLATFORM, requires_pocl
from runtime_core.conformance.cases import load_cases
from runtime_core.conformance.exclusions import load_exclusions
from runtime_core.conformance.runner import Summary, run_cases


@requires_pocl
def test_conformance_with_opencl_first_matches_cpu():
    cases = load_cases()
    res = run_cases(cases, ["opencl", "cpu"], provider_options=[{"platform": TEST_PLATFORM}, {}],
                    jobs=os.cpu_count() or 2)
    excl = load_exclusions()
    summary = Summary(res)
    claimed = [r for r in res if r.placement and set(r.placement) == {OCL}]
    touched = [r for r in res if r.placement.get(OCL)]
    print(f"\n{summary.table()}\nOpenCL claims every node of {len(claimed)} case(s) "
          f"({sum(r.passed for r in claimed)} passed) and runs nodes of {len(touched)}")
    unexpected = [f"{r.id}: {r.status}: {r.message.splitlines()[0] if r.message else ''}"[:300]
                  for r in res if not r.passed and r.id not in excl]
    assert not unexpected, "\n".join(unexpected)
    assert summary.passed >= 2013  # the CPU provider's floor (tests/conformance)
    assert len(claimed) >= 500, f"OpenCL claims only {len(claimed)} whole cases"
    assert all(r.passed or r.id in excl for r in claimed)
