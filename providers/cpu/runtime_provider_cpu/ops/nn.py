"""CPU kernels: nn."""
