"""Whether runtime-core loads and runs a corpus model and matches onnxruntime on it."""

from __future__ import annotations

import numpy as np

from . import build

TOLERANCE = 1e-3


def check_one(name: str, cache, size: str) -> str:
    """``""`` when runtime-core matches onnxruntime on entry ``name``; else what went wrong."""
    import onnxruntime as ort

    import runtime_core as rt

    model, feeds_path = build(name, cache, size)
    with np.load(feeds_path) as z:
        feeds = {k: z[k] for k in z.files}
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = rt.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)
    if len(got) != len(want):
        return f"{len(got)} outputs against onnxruntime's {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape} against onnxruntime's {w.shape}"
        if g.dtype.kind in "fiub" and g.size:
            d = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))))
            scale = max(float(np.max(np.abs(w.astype(np.float64)))), 1e-12)
            if not d / scale <= TOLERANCE:
                return f"output {i}: max abs difference {d:.3g} ({d / scale:.3g} of its largest magnitude)"
    return ""
