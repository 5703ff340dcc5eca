"""The names kernel modules and other code import: the work lives in :mod:`.execution`."""

from .execution import (
                        CPUExecutable,
                        CPUKernelError,
                        binds,
                        check_stop,
                        inplace_variant,
                        intra_op_threads,
                        pairs,
                        siblings,
)
from .execution.subgraph import Subgraph, subgraph_decline_reason

__all__ = ["CPUExecutable", "CPUKernelError", "Subgraph", "binds", "check_stop", "inplace_variant",
           "intra_op_threads", "pairs", "siblings", "subgraph_decline_reason"]
