"""ORT-compatible option objects and enums."""

from __future__ import annotations

import enum


class GraphOptimizationLevel(enum.IntEnum):
    """ORT's optimization levels (same names and values)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """ORT's execution modes."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class SessionOptions:
    """Options of an :class:`InferenceSession` (ORT's names and defaults)."""

    def __init__(self) -> None:
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.optimized_model_filepath = ""
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.enable_cpu_mem_arena = True
        self.use_deterministic_compute = False
        self._config: dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Set a session config entry (``session.disable_cpu_ep_fallback``, ...)."""
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        """The value of a config entry; raises ``KeyError`` naming the known keys if unset."""
        try:
            return self._config[key]
        except KeyError:
            known = ", ".join(sorted(self._config)) or "none"
            raise KeyError(f"session config entry {key!r} is not set (set entries: {known})") from None

    def get_config(self, key: str, default: str | None = None) -> str | None:
        """The config entry ``key`` or ``default``."""
        return self._config.get(key, default)

    @property
    def config_entries(self) -> dict[str, str]:
        return dict(self._config)


class RunOptions:
    """Options of one ``run`` call (ORT's names)."""

    def __init__(self) -> None:
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.run_tag = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        return self._config[key]
