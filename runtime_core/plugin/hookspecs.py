"""Hook specifications of the runtime-core plugin API.

A provider distribution exposes one plugin object (a module or an instance) through
the entry-point group ``runtime_core.providers``; the entry-point name is the
provider's short alias. The plugin implements the hooks below. Hooks only
*register*: the work is done by the provider classes they register (see
:class:`runtime_core.plugin.ExecutionProvider`), never by hook call order.

A hook implementation is recognised either by the :data:`runtime_core.plugin.hookimpl`
marker or, for plugins that must not import runtime-core (the CPU provider), by
its ``runtime_core_`` name prefix alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from .registry import ProviderRegistrar

PROJECT_NAME = "runtime_core"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marks a hook specification of the plugin API (the core's side; providers use ``hookimpl``)."""


@hookspec
def runtime_core_register_providers(registrar: "ProviderRegistrar") -> None:
    """Register the execution provider classes this plugin ships.

    Called once per plugin when the core loads its plugins (at first use of the
    provider API, not at import of ``runtime_core``). Call
    ``registrar.register(ProviderClass)`` for each provider class. A provider
    class carries its identity as class attributes (``name``, ``alias``,
    ``version``, ``distribution``, ``plugin_api``) and implements ``probe()``;
    see :class:`runtime_core.plugin.ExecutionProvider` for the whole contract.

    The hook must be cheap: it must not import heavy libraries (cupy, pyopencl)
    nor touch a device; that belongs in ``probe()``. An exception raised here is
    reported by ``get_provider_info()`` and the plugin is skipped.
    """
