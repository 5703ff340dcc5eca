"""Running a partitioned graph: the plan and its executor."""

from .executor import ExecutionPlan

__all__ = ["ExecutionPlan"]
