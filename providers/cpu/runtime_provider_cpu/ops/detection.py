"""CPU kernels: NonMaxSuppression.

The IoU of all candidates of a class is computed at once; the greedy selection then runs
over boxes (the selection is sequential by nature).
"""

from __future__ import annotations

import numpy as np

from ..registry import kernel
from ._nncommon import _attr


def _scalar(v, cast, default):
    if v is None:
        return default
    a = np.asarray(v).reshape(-1)
    return default if a.size == 0 else cast(a[0])


def _corners(boxes, center_point_box):
    """[..., 4] -> (y_min, x_min, y_max, x_max) in float64."""
    b = boxes.astype(np.float64)
    if center_point_box:
        xc, yc, w, h = b[..., 0], b[..., 1], b[..., 2] / 2, b[..., 3] / 2
        return yc - h, xc - w, yc + h, xc + w
    return (np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3]),
            np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3]))


def _nms_check(node):
    cpb = _attr(node, "center_point_box", 0)
    if cpb not in (0, 1):
        return f"NonMaxSuppression: center_point_box {cpb} is not 0 or 1"
    return None


@kernel("NonMaxSuppression", 10, 11, check=_nms_check)
def non_max_suppression(ctx, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box):
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise ValueError(f"NonMaxSuppression: boxes {boxes.shape} must be [B, N, 4] and scores "
                         f"{scores.shape} [B, C, N]")
    B, Nb = boxes.shape[:2]
    if scores.shape[0] != B or scores.shape[2] != Nb:
        raise ValueError(f"NonMaxSuppression: scores shape {scores.shape} does not fit boxes {boxes.shape}")
    max_out = max(_scalar(max_output_boxes_per_class, int, 0), 0)
    iou_t = _scalar(iou_threshold, float, 0.0)
    score_t = _scalar(score_threshold, float, None)
    C = scores.shape[1]
    if max_out == 0 or B * C * Nb == 0:
        return np.zeros((0, 3), dtype=np.int64)
    y0, x0, y1, x1 = _corners(boxes, center_point_box)
    area = (x1 - x0) * (y1 - y0)
    sel = []
    for b in range(B):
        for c in range(C):
            sc = scores[b, c].astype(np.float64)
            cand = np.nonzero(sc > score_t)[0] if score_t is not None else np.arange(Nb)
            if cand.size == 0:
                continue
            order = cand[np.lexsort((cand, -sc[cand]))]  # score descending, then lower index
            by0, bx0, by1, bx1, ba = (v[b, order] for v in (y0, x0, y1, x1, area))
            iy = np.minimum(by1[:, None], by1[None, :]) - np.maximum(by0[:, None], by0[None, :])
            ix = np.minimum(bx1[:, None], bx1[None, :]) - np.maximum(bx0[:, None], bx0[None, :])
            inter = np.where((iy > 0) & (ix > 0), iy * ix, 0.0)
            union = ba[:, None] + ba[None, :] - inter
            with np.errstate(divide="ignore", invalid="ignore"):
                ok = (inter > 0) & (ba[:, None] > 0) & (ba[None, :] > 0) & (union > 0)
                suppress = ok & (np.where(ok, inter / np.where(ok, union, 1.0), 0.0) > iou_t)
            kept = []
            for i in range(order.size):
                if kept and suppress[i, kept].any():
                    continue
                kept.append(i)
                if len(kept) >= max_out:
                    break
            sel.extend((b, c, int(order[i])) for i in kept)
    return np.array(sel, dtype=np.int64).reshape(-1, 3)
