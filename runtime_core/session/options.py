"""ORT-compatible option objects and enums."""

from __future__ import annotations

import enum
import operator
import os

from ..errors import InvalidArgumentError


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
        self._free_dims_by_name: dict[str, int] = {}
        self._free_dims_by_denotation: dict[str, int] = {}

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix the symbolic dim ``dim_name`` to ``dim_value`` before optimization (ORT's name);
        ``get_inputs()`` then reports the value and feeds must match it."""
        from .typecheck import check_free_dimension

        k, v = check_free_dimension("name", dim_name, dim_value)
        self._free_dims_by_name[k] = v

    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None:
        """Fix every dim whose denotation is ``dim_denotation`` (``DATA_BATCH``, ...) to
        ``dim_value`` before optimization (ORT's name)."""
        from .typecheck import check_free_dimension

        k, v = check_free_dimension("denotation", dim_denotation, dim_value)
        self._free_dims_by_denotation[k] = v

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


def _thread_count(opts, attr: str) -> int:
    value = getattr(opts, attr)
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)  # ints and numpy ints, not floats
    except TypeError:
        raise InvalidArgumentError(
            f"SessionOptions.{attr} must be an int >= 0 (0 = default), got {value!r}") from None
    if n < 0:
        raise InvalidArgumentError(
            f"SessionOptions.{attr} must be >= 0 (0 = default, 1 = one thread), got {n}")
    return n


def default_thread_count() -> int:
    """The cores this process may use (``inter_op_num_threads = 0`` means this many)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def inter_op_threads(opts: SessionOptions) -> int:
    """Validate the threading options of ``opts``; the number of threads that may run
    independent nodes at once: 1 under ``ORT_SEQUENTIAL``; under ``ORT_PARALLEL``
    ``inter_op_num_threads`` (0: :func:`default_thread_count`), the caller's thread included.

    Raises :class:`InvalidArgumentError` naming the option for an unknown
    ``execution_mode`` or a negative or non-integer thread count.
    """
    mode = opts.execution_mode
    try:
        mode = ExecutionMode(mode)
    except (ValueError, TypeError):
        modes = ", ".join(f"ExecutionMode.{m.name} ({m.value})" for m in ExecutionMode)
        raise InvalidArgumentError(
            f"SessionOptions.execution_mode must be one of {modes}, got {mode!r}") from None
    _thread_count(opts, "intra_op_num_threads")
    n = _thread_count(opts, "inter_op_num_threads")
    if mode is ExecutionMode.ORT_SEQUENTIAL:
        return 1
    return n if n > 0 else default_thread_count()


class RunOptions:
    """Options of one ``run`` call (ORT's names)."""

    def __init__(self) -> None:
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.run_tag = ""
        #: the flags of the runs in flight with these options (``execution.cancel.RunStop``)
        self._run_flags: dict[int, bytearray] = {}
        self._terminate = False
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}

    @property
    def terminate(self) -> bool:
        """Set to True (from any thread) to end the runs made with these options: each stops
        within about 100 ms with ``RunTerminatedError``, inside a long compiled kernel too; a
        run started while it is True is refused at once."""
        return self._terminate

    @terminate.setter
    def terminate(self, value: bool) -> None:
        self._terminate = bool(value)
        if self._terminate:
            for flag in tuple(self._run_flags.values()):
                flag[0] = 1

    def _watch(self, flag: bytearray) -> None:
        self._run_flags[id(flag)] = flag

    def _unwatch(self, flag: bytearray) -> None:
        self._run_flags.pop(id(flag), None)

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        return self._config[key]


def session_settings(opts: SessionOptions, intra: int):
    """What providers see of ``opts`` (``runtime_core.plugin.SessionSettings``); ``intra``: the
    resolved intra-op thread count."""
    from ..plugin.contract import SessionSettings

    inter = _thread_count(opts, "inter_op_num_threads") or default_thread_count()
    return SessionSettings(
        graph_optimization_level=int(opts.graph_optimization_level),
        log_severity_level=int(opts.log_severity_level), log_verbosity_level=int(opts.log_verbosity_level),
        intra_op_num_threads=int(intra), inter_op_num_threads=int(inter),
        execution_mode=int(opts.execution_mode), enable_cpu_mem_arena=bool(opts.enable_cpu_mem_arena),
        enable_mem_pattern=bool(opts.enable_mem_pattern), enable_mem_reuse=bool(opts.enable_mem_reuse),
        use_deterministic_compute=bool(opts.use_deterministic_compute), config_entries=opts.config_entries)
