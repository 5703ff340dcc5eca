"""Kernel modules of the CPU provider, imported explicitly by name."""

from . import (  # noqa: F401
    attention, control, elementwise, fused, image, layout, loss, mathx, ml, nn, nnx, quant, random_ops, reduce,
    rnn, sequence, signal, strings, tensor,
)
