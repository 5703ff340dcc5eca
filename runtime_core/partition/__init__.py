"""Assigning nodes to providers and cutting the graph into convex partitions."""

from .partitioner import partition_graph
from .report import CopyEntry, NodeEntry, PartitionReport

__all__ = ["CopyEntry", "NodeEntry", "PartitionReport", "partition_graph"]
