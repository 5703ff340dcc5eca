"""Kernel modules of the CPU provider, imported explicitly by name."""

from . import (  # noqa: F401
    attention, elementwise, fused, image, loss, ml, nn, nnx, quant, random_ops, reduce, rnn, signal, strings,
    tensor,
)
