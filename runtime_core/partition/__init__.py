"""Assigning nodes to providers and cutting the graph into convex partitions."""

from .partitioner import partition_graph
from .report import CopyEntry, FusionEntry, NodeEntry, PartitionReport

__all__ = ["CopyEntry", "FusionEntry", "NodeEntry", "PartitionReport", "partition_graph"]
