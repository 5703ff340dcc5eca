"""The provider guide stays true: its excerpts are the example's code, and its two-file provider works.

The second test is the guide's acceptance check: a provider written from the guide alone,
outside the repository, installed with pip, is discovered, partitioned with CPU
fallback (with device copies), and passes the conformance kit.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from kit_helpers import pip_install_target, run_pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "writing-a-provider.md"
BLOCK = re.compile(r"<!-- (from|file):? (\S+) -->\n```\w*\n(.*?)```", re.S)


def _blocks(kind):
    return [(path, body) for k, path, body in BLOCK.findall(GUIDE.read_text()) if k == kind]


def test_the_guide_has_excerpts_and_files():
    assert len(_blocks("from")) >= 8
    assert [p for p, _ in _blocks("file")] == ["pyproject.toml", "runtime_provider_tiny.py"]


@pytest.mark.parametrize("path,body", _blocks("from"), ids=[f"{i}:{p}" for i, (p, _) in enumerate(_blocks("from"))])
def test_every_excerpt_is_the_example_code(path, body):
    source = (ROOT / path).read_text()
    assert textwrap.dedent(body).strip() in textwrap.dedent(source) or body.strip() in source, (
        f"the guide's excerpt of {path} is not in that file any more:\n{body}")


def _tiny_model():
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["s"]),
         helper.make_node("Neg", ["s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_the_two_file_provider_from_the_guide(tmp_path):
    pkg = tmp_path / "runtime-provider-tiny"
    pkg.mkdir()
    for path, body in _blocks("file"):
        (pkg / path).write_text(body)
    target = tmp_path / "site"
    pip_install_target(pkg, target)
    # discovered, partitioned with CPU fallback and copies, right results: in a fresh process
    check = tmp_path / "test_tiny_session.py"
    check.write_text(textwrap.dedent(f"""
        import numpy as np
        import runtime_core as rt

        def test_session():
            assert "TinyExecutionProvider" in rt.get_available_providers()
            sess = rt.InferenceSession({_tiny_model()!r}, providers=["tiny", "cpu"])
            rep = sess.get_partition_report()
            placed = {{n.op_type: n.provider for n in rep.nodes}}
            assert placed == {{"Relu": "TinyExecutionProvider", "Sigmoid": "CPUExecutionProvider",
                              "Neg": "TinyExecutionProvider"}}, placed
            (sig,) = [n for n in rep.nodes if n.op_type == "Sigmoid"]
            assert sig.declined["TinyExecutionProvider"] == "Sigmoid-13 is not implemented"
            tiny, cpu = "TinyExecutionProvider", "CPUExecutionProvider"
            assert [(c.src, c.dst) for c in rep.copies] == [
                ("host", tiny), (tiny, cpu), (cpu, tiny), (tiny, "host")], rep.copies
            x = np.array([[-1.0, 0.5, 2.0], [3.0, -0.25, 0.0]], np.float32)
            (y,) = sess.run(None, {{"x": x}})
            np.testing.assert_allclose(y, -1 / (1 + np.exp(-np.maximum(x, 0))), rtol=1e-6)
    """))
    proc = run_pytest([str(check), "-q"], tmp_path, [target])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # checked by the kit
    proc = run_pytest(["--runtime-provider", "tiny", "--runtime-provider-cases", r"^node/test_(relu|neg|add)$",
                       "-q", "-rf"], tmp_path / "site", [target])
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    assert "claimed fully: 2" in out and "claimed cases: 2 run, 2 passed, 0 failed" in out
    assert "fallback chains: 2 run, 2 passed" in out
    assert np.dtype  # numpy is what the guide's provider uses
