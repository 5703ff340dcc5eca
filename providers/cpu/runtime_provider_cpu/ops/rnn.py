"""CPU kernels: rnn."""
