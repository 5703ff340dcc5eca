"""Kernel modules of the CPU provider, imported explicitly by name."""

from . import (  # noqa: F401
    arith, attention, casting, contrib_ml, control, conv, crop, detection, dropout, elementwise, fused, image,
    layout, linalg, loss, matmul, ml, norm, pool, quant, quant_contrib, quant_dyn, random_ops, reduce, resize, rnn, roi, sampling, sequence,
    signal, softmax, strings, tensor, training, unfold,
)
from ..fast import pairs  # noqa: F401 - registers the pair fusers (fast/pairs.py)
