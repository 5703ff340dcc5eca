"""Kernel modules of the CPU provider, imported explicitly by name."""

from . import elementwise, fused, ml, nn, reduce, rnn, tensor  # noqa: F401
