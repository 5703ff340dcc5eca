"""CPU kernels: ml."""
