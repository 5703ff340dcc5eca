"""The conformance suite as a pytest test class (the kit's fixture-based API).

A provider's own tests subclass :class:`ProviderConformance` and name the provider::

    from runtime_core.testing.suite import ProviderConformance

    class TestAcmeConformance(ProviderConformance):
        provider = "acme"
        options = {"some_option": "1"}   # provider options of every session (optional)

``pytest --runtime-provider NAME`` runs the same class for any installed provider.
Parametrized checks are generated from the provider's capability answers at
collection, so every claimed case is one test item.
"""

from __future__ import annotations

import pytest

from .kit import ConformanceFailure, ConformanceKit

__all__ = ["ProviderConformance", "get_kit"]

_KITS_ATTR = "_runtime_core_kits"


def get_kit(config, provider: str, options=None, *, folders=("node",), pattern=None,
            tolerances=None, case_timeout: float = 120.0, op_tolerances=None) -> ConformanceKit:
    """The one :class:`ConformanceKit` of this pytest run for these settings (created on first use)."""
    kits = getattr(config, _KITS_ATTR, None)
    if kits is None:
        kits = {}
        setattr(config, _KITS_ATTR, kits)
    options = dict(options or {})
    tolerances = dict(tolerances or {})
    op_tolerances = dict(op_tolerances or {})
    key = (provider, tuple(sorted(options.items())), tuple(folders), pattern,
           tuple(sorted(tolerances.items())), case_timeout, tuple(sorted(op_tolerances.items())))
    if key not in kits:
        kits[key] = ConformanceKit(provider, options, folders=folders, pattern=pattern,
                                   tolerances=tolerances, case_timeout=case_timeout,
                                   op_tolerances=op_tolerances)
    return kits[key]


def all_kits(config) -> list[ConformanceKit]:
    """Every kit this pytest run used (for the terminal summary)."""
    return list((getattr(config, _KITS_ATTR, None) or {}).values())


def _params(kit: ConformanceKit, what: str, entries_fn, ids_by_id: bool) -> list:
    """One param per scan entry; a failing scan gives one param whose test re-raises it."""
    try:
        entries = entries_fn()
    except ConformanceFailure:
        return [pytest.param(None, id="unavailable")]
    if not entries:
        return [pytest.param(None, id="none", marks=pytest.mark.skip(
            reason=f"{kit.name} claims no {what} among the selected cases"))]
    return [pytest.param(e, id=e.id if ids_by_id else e.name) for e in entries]


class ProviderConformance:
    """Subclass (named ``Test...``) and set ``provider`` to run the conformance kit on it.

    Class attributes: ``provider`` (ORT name or alias), ``options`` (provider options
    of every session the kit builds), ``cases`` (a regular expression selecting
    cases by ``folder/name``; ``None`` for all), ``folders`` (suite folders, default
    ``("node",)``), ``tolerances`` (dtype name -> ``(rtol, atol)`` overrides),
    ``op_tolerances`` (op -> ``(rtol, atol)``, the least tolerance of a case with that op:
    ``{"DFT": (1e-3, 1e-3)}``), ``case_timeout`` (seconds after which a case counts as
    hung). The command-line options ``--runtime-provider-option``,
    ``--runtime-provider-cases``, ``--runtime-provider-timeout`` and
    ``--runtime-provider-tolerance`` add to and override these.
    """

    provider: str | None = None
    options: dict = {}
    cases: str | None = None
    folders: tuple = ("node",)
    tolerances: dict = {}
    op_tolerances: dict = {}
    case_timeout: float = 120.0

    @classmethod
    def _kit(cls, config) -> ConformanceKit | None:
        from .plugin import cli_settings

        cli = cli_settings(config)
        provider = cls.provider or cli["provider"]
        if not provider:
            return None
        options = {**cls.options, **cli["options"]}
        pattern = cli["cases"] or cls.cases
        folders = cli["folders"] or cls.folders
        return get_kit(config, provider, options, folders=folders, pattern=pattern,
                       tolerances={**cls.tolerances, **cli.get("tolerances", {})},
                       case_timeout=cli["timeout"] or cls.case_timeout,
                       op_tolerances={**cls.op_tolerances, **cli.get("op_tolerances", {})})

    def pytest_generate_tests(self, metafunc):
        """Parametrize the per-case checks from the provider's capability answers."""
        kit = type(self)._kit(metafunc.config)
        wanted = {
            "rc_claimed_case": ("claimed case", lambda: kit.claimed_cases()),
            "rc_partial_case": ("partially claimed case", lambda: kit.partial_cases()),
            "rc_chain_case": ("chainable one-node case", lambda: kit.chain_cases()),
            "rc_copy_dtype": ("tensor dtype", lambda: kit.copy_dtypes()),
        }
        for name, (what, fn) in wanted.items():
            if name not in metafunc.fixturenames:
                continue
            if kit is None:
                metafunc.parametrize(name, [pytest.param(None, id="no-provider", marks=pytest.mark.skip(
                    reason="no provider: set the class attribute provider or pass --runtime-provider"))])
                continue
            if name == "rc_copy_dtype":
                try:
                    dts = fn()
                    params = [pytest.param(d, id=d.name) for d in dts] or [pytest.param(
                        None, id="none", marks=pytest.mark.skip(reason=f"{kit.name} claims no node"))]
                except ConformanceFailure:
                    params = [pytest.param(None, id="unavailable")]
            else:
                params = _params(kit, what, fn, len(kit.folders) > 1)
            metafunc.parametrize(name, params)

    @pytest.fixture
    def kit(self, request) -> ConformanceKit:
        """The kit of this class's provider."""
        kit = type(self)._kit(request.config)
        if kit is None:
            pytest.skip("no provider: set the class attribute provider or pass --runtime-provider")
        return kit

    def test_discovered(self, kit):
        """Found through its entry point, loaded, complete identity, available."""
        kit.check_discovery()

    def test_probe_never_raises(self, kit):
        """``probe()`` returns an answer (with a reason when unavailable), three times alike."""
        kit.check_probe()

    def test_capability_contract(self, kit):
        """Claims are offered nodes, once each, convex groups, stable; no claim is also declined."""
        kit.check_capability()

    def test_declines_carry_reasons(self, kit):
        """Every node the provider does not take has a reason."""
        kit.check_decline_reasons()

    def test_claimed_case(self, kit, rc_claimed_case):
        """A case it claims fully runs on it alone and gives the CPU (or expected) result."""
        if rc_claimed_case is None:
            kit.scan()
        kit.check_case(rc_claimed_case)

    def test_partial_case(self, kit, rc_partial_case):
        """A case it claims partly partitions as claimed, falls back to CPU, and is right."""
        if rc_partial_case is None:
            kit.scan()
        kit.check_case(rc_partial_case)

    def test_fallback_chain(self, kit, rc_chain_case):
        """provider -> host provider -> provider, with copies at both boundaries, is right."""
        if rc_chain_case is None:
            kit.scan()
        res = kit.check_chain(rc_chain_case)
        if res.outcome != "passed":
            pytest.skip(f"not exercised: {res.message}")

    def test_concurrent_runs(self, kit):
        """Sessions on the provider run from several threads give the single-threaded results."""
        kit.check_concurrency()

    def test_copies_round_trip(self, kit, rc_copy_dtype):
        """Host -> device -> host gives back the same bits, for every claimed dtype."""
        if rc_copy_dtype is None:
            kit.scan()
        kit.check_copies(rc_copy_dtype)
