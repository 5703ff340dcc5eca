"""Machine paths of the CPU provider: how this machine runs an op fast.

The reference kernels in ``ops/`` say what an op means; the modules here pick and run a
faster way for one machine and one shape (a plan class per algorithm, the weight layouts
the compiled kernels read, the pair fusers), steered by one frozen :class:`~.policy.Policy`.
"""
