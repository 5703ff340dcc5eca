"""Plugin discovery: entry points, isolation, API-version checks, and the registry.

Every plugin, the built-in CPU provider included, is found through the entry-point
group ``runtime_core.providers`` and loaded in isolation: a plugin that fails to
import, to register, to pass the API check, or to probe is recorded with the
reason and skipped; it never breaks the core.

Environment:

* ``RUNTIME_CORE_DISABLE_PLUGINS``: comma-separated entry-point names not to load,
  or ``1``/``all``/``*`` for every plugin except ``cpu`` (the fallback);
* ``RUNTIME_CORE_PLUGINS``: an allow list (comma-separated names); ``cpu`` is
  always allowed; a name that matches no installed plugin is warned about;
* ``RUNTIME_CORE_DEFAULT_PROVIDERS``: the providers of sessions that name none (see
  :func:`default_providers`).
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from . import hookspecs
from .contract import ProbeResult

logger = logging.getLogger("runtime_core.plugin")

API_VERSION = "1.4"
"""The plugin API version of this runtime-core; minor bumps only add.

1.0: hooks, the provider class (probe, get_capability, compile, device memory and copies).
1.1: optional device-tensor methods for OrtValue/IOBinding/DLPack (all with defaults) and
``GraphView.all_nodes``.
1.2: ``Partition.intra_op_num_threads`` (default 0: not said), the threads one node's kernel
may use.
1.3: cancellation: an executable whose ``run`` takes a ``stop`` keyword gets a callable that
raises ``RunTerminatedError`` once ``RunOptions.terminate`` is set (see
``ExecutionProvider.compile``); an executable's optional ``fusions()``, shown by the
partition report; ``NodeView.subgraphs``, the bodies of a node's GRAPH attributes as views;
``Partition.max_tensor_bytes`` (default 0: not said), the session's tensor-size cap.
1.4: subgraph delegation: ``NodeView.to_proto()`` and ``NodeView.proto_attrs`` (the node as
written, attribute types and bodies kept); ``GraphView.opset_imports`` and ``ir_version``;
``Partition.opset_imports`` (bodies' domains included), ``ir_version`` and ``to_model()`` (a
checker-clean model of exactly the partition), ``GraphView.to_model(nodes)``; outputs of the optimizer's ``com.microsoft``
ops are typed; partition shaping: an optional ``min_partition_size`` and
``review_partitions(partitions)`` on the provider; ``SessionSettings``, the session's
settings, as ``GraphView.settings`` and ``Partition.settings``. All optional: a 1.3 provider
runs unchanged. Also ``Partition.config``, the session's config entries; an executable's optional
``kernels()``, the kernel each node was given on this machine, shown by the partition report.
"""

ENTRY_POINT_GROUP = "runtime_core.providers"
"""The entry-point group providers are found in; an entry point's name is the provider's alias."""

FALLBACK_ALIAS = "cpu"
DEFAULT_PROVIDERS_ENV = "RUNTIME_CORE_DEFAULT_PROVIDERS"
DEFAULT_PROVIDERS_CONFIG = "session.default_providers"
"""Session config entry that names the default providers of one session (same form as the env)."""
REQUIRED_ATTRS = ("name", "alias", "version", "distribution", "plugin_api")

hookimpl = pluggy.HookimplMarker(hookspecs.PROJECT_NAME)
"""Marks a plugin's hook implementation: ``@hookimpl def runtime_core_register_providers(registrar)``."""


_PROBED = frozenset({"available", "reason", "devices", "status"})
_PROBE_LOCK = threading.RLock()


@dataclass
class ProviderRecord:
    """Everything known about one installed provider (or one broken plugin).

    ``status`` is ``"loaded"`` (registered; see ``available``), or the stage at
    which loading failed: ``"disabled"``, ``"import-error"``, ``"register-error"``,
    ``"bad-registration"``, ``"api-mismatch"``, ``"probe-error"``, ``"no-provider"``.
    """

    name: str
    alias: str
    distribution: str = ""
    version: str = ""
    plugin_api: str = ""
    available: bool = False
    reason: str = ""
    status: str = "loaded"
    devices: list = field(default_factory=list)
    entry_point: str = ""
    cls: Any = field(default=None, repr=False)
    #: the provider class whose ``probe()`` has not run yet: probing is deferred until
    #: ``available``, ``reason``, ``devices`` or ``status`` is read, so a session that never
    #: names a provider never pays for its probe (OpenCL's imports pyopencl: ~110 MiB)
    pending: Any = field(default=None, repr=False, compare=False)

    def __getattribute__(self, name: str):
        if name in _PROBED and object.__getattribute__(self, "pending") is not None:
            object.__getattribute__(self, "_run_probe")()
        return object.__getattribute__(self, name)

    def _run_probe(self) -> None:
        with _PROBE_LOCK:
            cls = object.__getattribute__(self, "pending")
            if cls is None:  # another thread probed it meanwhile
                return
            self.pending = None  # a probe that reads the registry sees this record as unprobed
            try:
                probe = _safe_probe(cls)
            except BaseException as exc:  # noqa: BLE001 - a plugin must never break the core
                if isinstance(exc, KeyboardInterrupt):
                    raise
                self.status, self.available = "probe-error", False
                self.reason = f"probe() raised {_short_exc(exc)}"
                logger.warning("plugin %s skipped (probe-error): %s", self.alias, self.reason)
            else:
                self.available, self.reason, self.devices = probe.available, probe.reason, probe.devices
                logger.debug("provider %s probed (available=%s)", self.name, probe.available)

    def registered(self) -> bool:
        """Loaded, or waiting for its probe (without running the probe)."""
        return self.pending is not None or self.status == "loaded"

    def to_dict(self) -> dict:
        """JSON-ready form (without the class object)."""
        return {
            "name": self.name,
            "alias": self.alias,
            "distribution": self.distribution,
            "version": self.version,
            "plugin_api": self.plugin_api,
            "available": self.available,
            "reason": self.reason,
            "status": self.status,
            "devices": [str(d) for d in self.devices],
            "entry_point": self.entry_point,
        }


class ProviderRegistrar:
    """Handed to ``runtime_core_register_providers``; collects provider classes."""

    def __init__(self, plugin_name: str):
        self.plugin_name = plugin_name
        self.classes: list[type] = []

    def register(self, provider_cls: type) -> None:
        """Register one provider class (see :class:`runtime_core.plugin.ExecutionProvider`)."""
        self.classes.append(provider_cls)


class _PluginManager(pluggy.PluginManager):
    """Recognises hook implementations by marker or by the ``runtime_core_`` prefix."""

    def parse_hookimpl_opts(self, plugin, name):  # noqa: D401 - pluggy override
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("runtime_core_"):
            method = getattr(plugin, name, None)
            if callable(method):
                opts = {}
        return opts


def _env_list(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


def _short_exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _dist_of(ep) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "", ""
    return dist.metadata["Name"] or "", dist.version or ""


def _api_check(spec: str) -> str | None:
    try:
        ok = Version(API_VERSION) in SpecifierSet(spec)
    except InvalidSpecifier:
        return f"plugin_api {spec!r} is not a valid version specifier"
    if not ok:
        return (f"plugin supports plugin API {spec}, but runtime-core provides "
                f"plugin API {API_VERSION}")
    return None


def _safe_probe(cls) -> ProbeResult:
    result = cls.probe()
    if isinstance(result, dict):
        result = ProbeResult(**result)
    available = bool(getattr(result, "available"))
    reason = str(getattr(result, "reason", "") or "")
    devices = list(getattr(result, "devices", []) or [])
    if not available and not reason:
        reason = "probe() reported unavailable without a reason"
    return ProbeResult(available, reason, devices)


class Registry:
    """The loaded plugins and their providers; one per process (see :func:`get_registry`)."""

    def __init__(self, entry_points=None):
        self.pm = _PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.records: list[ProviderRecord] = []
        self.unknown_allowed: list[str] = []  # RUNTIME_CORE_PLUGINS names no plugin has
        self._load(entry_points)

    # -- loading ------------------------------------------------------------
    def _load(self, entry_points) -> None:
        if entry_points is None:
            entry_points = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
        disabled = _env_list("RUNTIME_CORE_DISABLE_PLUGINS") or []
        allow = _env_list("RUNTIME_CORE_PLUGINS")
        disable_all = any(d.lower() in ("1", "all", "*", "true") for d in disabled)
        seen: set[str] = set()
        for ep in sorted(entry_points, key=lambda e: (e.name != FALLBACK_ALIAS, e.name)):
            if ep.name in seen:
                dist, ver = _dist_of(ep)
                self.records.append(ProviderRecord(
                    name=ep.name, alias=ep.name, distribution=dist, version=ver,
                    status="bad-registration", entry_point=ep.value,
                    reason=f"another plugin already uses the entry-point name {ep.name!r}"))
                continue
            seen.add(ep.name)
            if ep.name != FALLBACK_ALIAS and (
                    disable_all or ep.name in disabled or (allow is not None and ep.name not in allow)):
                dist, ver = _dist_of(ep)
                why = ("RUNTIME_CORE_DISABLE_PLUGINS" if (disable_all or ep.name in disabled)
                       else "not in RUNTIME_CORE_PLUGINS")
                self.records.append(ProviderRecord(
                    name=ep.name, alias=ep.name, distribution=dist, version=ver,
                    status="disabled", reason=f"disabled by {why}", entry_point=ep.value))
                logger.info("plugin %s disabled (%s)", ep.name, why)
                continue
            self._load_one(ep)
        if allow is not None:
            names = {ep.name for ep in entry_points}
            unknown = [a for a in allow if a not in names]
            if unknown:
                # an allow list that names nothing installed silently disables every plugin
                logger.warning("RUNTIME_CORE_PLUGINS names %s, which no installed plugin provides "
                               "(installed: %s)", ", ".join(repr(u) for u in unknown),
                               ", ".join(sorted(names)) or "none")
                self.unknown_allowed = unknown

    def _fail(self, ep, status: str, reason: str, **extra) -> None:
        dist, ver = _dist_of(ep)
        rec = ProviderRecord(name=extra.pop("name", ep.name), alias=ep.name, distribution=dist,
                             version=extra.pop("version", ver), status=status, reason=reason,
                             entry_point=ep.value, **extra)
        self.records.append(rec)
        logger.warning("plugin %s skipped (%s): %s", ep.name, status, reason)

    def _load_one(self, ep) -> None:
        try:
            plugin = ep.load()
        except BaseException as exc:  # noqa: BLE001 - a plugin must never break the core
            if isinstance(exc, KeyboardInterrupt):
                raise
            logger.debug("import of plugin %s failed:\n%s", ep.name, traceback.format_exc())
            self._fail(ep, "import-error", f"import failed: {_short_exc(exc)}")
            return
        registrar = ProviderRegistrar(ep.name)
        try:
            self.pm.register(plugin, name=f"{ep.name}:{ep.value}")
            impls = [i for i in self.pm.hook.runtime_core_register_providers.get_hookimpls()
                     if i.plugin is plugin]
            if not impls:
                raise TypeError("the plugin object implements no runtime_core_register_providers hook")
            for impl in impls:
                impl.function(registrar=registrar)
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            logger.debug("registration of plugin %s failed:\n%s", ep.name, traceback.format_exc())
            self._fail(ep, "register-error", f"registration failed: {_short_exc(exc)}")
            return
        if not registrar.classes:
            self._fail(ep, "no-provider", "the plugin registered no provider class")
            return
        for cls in registrar.classes:
            self._add_class(ep, cls)

    def _add_class(self, ep, cls) -> None:
        missing = [a for a in REQUIRED_ATTRS if not isinstance(getattr(cls, a, None), str)
                   or not getattr(cls, a)]
        for meth in ("probe", "get_capability", "compile"):
            if not callable(getattr(cls, meth, None)):
                missing.append(f"{meth}()")
        if missing:
            self._fail(ep, "bad-registration",
                       f"provider class {getattr(cls, '__qualname__', cls)!r} lacks {', '.join(missing)}",
                       name=str(getattr(cls, "name", "") or ep.name))
            return
        ident = dict(name=cls.name, version=cls.version, plugin_api=cls.plugin_api)
        if any(r.name == cls.name and r.registered() for r in self.records):
            self._fail(ep, "bad-registration", f"provider name {cls.name!r} is already registered", **ident)
            return
        if any(r.alias == cls.alias and r.registered() for r in self.records):
            self._fail(ep, "bad-registration", f"provider alias {cls.alias!r} is already taken", **ident)
            return
        why = _api_check(cls.plugin_api)
        if why:
            self._fail(ep, "api-mismatch", why, **ident)
            return
        dist, _ = _dist_of(ep)
        self.records.append(ProviderRecord(
            name=cls.name, alias=cls.alias, distribution=cls.distribution or dist,
            version=cls.version, plugin_api=cls.plugin_api, status="loaded",
            entry_point=ep.value, cls=cls, pending=cls))
        logger.debug("provider %s registered (probed on first use)", cls.name)

    # -- queries ------------------------------------------------------------
    def loaded(self) -> list[ProviderRecord]:
        """Records of providers that registered correctly, CPU last (it is the fallback)."""
        recs = [r for r in self.records if r.status == "loaded"]
        return sorted(recs, key=lambda r: r.alias == FALLBACK_ALIAS)

    def lookup(self, name: str) -> ProviderRecord | None:
        """Find a record by ORT name or alias (case-insensitive), loaded or not."""
        low = name.lower()
        found = [r for r in self.records if r.name.lower() == low or r.alias.lower() == low]
        for rec in sorted(found, key=lambda r: not r.registered()):  # probes nothing
            return rec
        return None


def default_providers(config_value: str | None = None) -> list[str]:
    """The providers of a session that names none: the session config entry
    ``session.default_providers`` if set, else ``RUNTIME_CORE_DEFAULT_PROVIDERS``, else
    ``["CPUExecutionProvider"]`` (as onnxruntime's CPU package: installing a provider never
    changes such sessions). Either is a comma-separated list of names or aliases, or ``all``:
    every available provider in registry order."""
    raw = config_value if config_value is not None else os.environ.get(DEFAULT_PROVIDERS_ENV)
    names = [p.strip() for p in (raw or "").split(",") if p.strip()]
    if not names:
        return ["CPUExecutionProvider"]
    if [n.lower() for n in names] in (["all"], ["*"]):
        return [r.name for r in get_registry().loaded() if r.available]
    return names


_REGISTRY: Registry | None = None
_LOCK = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry, loading plugins on first use."""
    global _REGISTRY
    with _LOCK:
        if _REGISTRY is None:
            _REGISTRY = Registry()
        return _REGISTRY


def reload_plugins(entry_points=None) -> Registry:
    """Forget loaded plugins and discover them again (after installing one, or in tests)."""
    global _REGISTRY
    with _LOCK:
        _REGISTRY = Registry(entry_points)
        return _REGISTRY
