"""``python -m corpus list | build | check`` (from ``benchmarks/``); see the package docstring.

``check`` builds each model, loads it in onnxruntime and in runtime-core, runs both on the stored
feeds and compares the outputs (max difference relative to the output's largest magnitude, at
most 1e-3); it exits 1 if any model fails to build, load, run or match.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

from . import ENTRIES, SIZES, build, select
from .check import check_one


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m corpus")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    for cmd in ("build", "check"):
        s = sub.add_parser(cmd)
        s.add_argument("names", nargs="*")
        s.add_argument("--cache", required=True)
        s.add_argument("--size", choices=SIZES, default="bench")
        s.add_argument("--half", choices=("tune", "report", "all"), default="all")
    a = p.parse_args(argv)
    if a.cmd == "list":
        for n, e in ENTRIES.items():
            print(f"{e.half:6}  {n:36}  {e.description}")
        return 0
    names = a.names or select(a.half)
    bad = 0
    for n in names:
        t = time.perf_counter()
        try:
            if a.cmd == "build":
                model, _ = build(n, a.cache, a.size)
                msg = f"{model.stat().st_size / 2**20:.1f} MiB"
            else:
                msg = check_one(n, a.cache, a.size) or "ok"
        except Exception as exc:  # one model's failure is reported; the others go on
            msg = f"FAILED: {type(exc).__name__}: {str(exc)[:600]}"
            traceback.print_exc(limit=3)
        bad += msg.startswith("FAILED") or (a.cmd == "check" and msg != "ok")
        print(f"{n}: {msg} ({time.perf_counter() - t:.1f} s)", flush=True)
    print(f"{len(names) - bad} of {len(names)} ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
