"""How a compiled CPU partition runs, one module per job.

``executable`` (the compiled partition and its run loops), ``step`` (the one step body,
kernel errors, the run's stop), ``inplace`` (in-place variants), ``fusion`` (bound steps and
the pair / sibling fusions made after the first run), ``schedule`` and ``parallel``
(``ORT_PARALLEL`` runs), ``subgraph`` (If / Loop / Scan bodies).
"""

from .executable import CPUExecutable, intra_op_threads
from .fusion import binds, pairs, siblings
from .inplace import inplace_variant
from .step import CPUKernelError, check_stop

__all__ = ["CPUExecutable", "CPUKernelError", "binds", "check_stop", "inplace_variant",
           "intra_op_threads", "pairs", "siblings"]
