"""``python -m runtime_core.optimizer MODEL.onnx [...]``: node counts at every level.

For each model: the node count of the file and after the optimizer at each
graph-optimization level (with the reduction), the rewrites per pass at the
highest level, and (``--ops``) the op types left. Only the optimizer runs; no
session is created.
"""

from __future__ import annotations

import argparse
import collections

from ..graph import Graph, load_model
from . import optimize


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime_core.optimizer", description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--ops", action="store_true", help="list the op types left at the highest level")
    args = ap.parse_args(argv)
    for path in args.models:
        model, _ = load_model(path)
        before = len(model.graph.node)
        cells = []
        done = {}
        g = None
        for level, name in ((1, "basic"), (2, "extended"), (99, "all")):
            g = Graph(model)
            done = optimize(g, level)
            cells.append(f"{name} {len(g.nodes)} (-{100 * (1 - len(g.nodes) / max(before, 1)):.0f}%)")
        print(f"{path}: {before} nodes; " + ", ".join(cells))
        print("  rewrites: " + ", ".join(f"{k} {v}" for k, v in done.items() if v))
        if args.ops:
            hist = collections.Counter((f"{n.domain}." if n.domain else "") + n.op_type for n in g.nodes)
            print("  ops: " + ", ".join(f"{k} {v}" for k, v in hist.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
