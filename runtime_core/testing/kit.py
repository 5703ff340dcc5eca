"""The provider conformance kit: checks that an installed provider keeps the plugin contract.

:class:`ConformanceKit` holds every check; the pytest plugin
(:mod:`runtime_core.testing.plugin`) and :class:`runtime_core.testing.suite.ProviderConformance`
turn them into test items, and ``ConformanceKit.run_all()`` runs them without pytest.
The checks:

* **discovery**: the provider is found through its entry point, registers without
  error, its identity is complete and its plugin-API range admits this core;
* **probe**: ``probe()`` never raises and returns an availability with a reason;
* **capability**: over the models of the ONNX backend node cases, ``get_capability``
  never raises, claims only offered nodes, each at most once, never claims and
  declines the same node, claims only convex groups, answers the same twice, and
  copes with a view from which a higher-priority provider took nodes;
* **declines carry reasons**: every offered node it does not claim has a reason;
* **claimed cases**: every case whose nodes it all claims runs on it alone and gives
  the CPU provider's result (tolerances per dtype, :mod:`runtime_core.testing.compare`)
  or the case's expected output;
* **partial cases**: a case of which it claims some nodes partitions with CPU
  fallback exactly as claimed and gives the same result;
* **fallback chains**: a claimed one-node case chained three times, the middle copy
  taken by a higher-priority helper provider running on the host, runs with the
  copies that this needs and gives the CPU result;
* **concurrency**: one session run from several threads at once gives the
  single-threaded result every time;
* **copies**: ``copy_to_host(copy_to_device(a))`` returns ``a`` bit for bit, for every
  dtype the provider claims and shapes from scalars to empty and strided arrays.

Sessions built by the kit use ``ORT_DISABLE_ALL`` so that the nodes offered to the
provider in a session are exactly the nodes of the model the capability check saw.
"""

from __future__ import annotations

import logging
import threading
import traceback
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Mapping

import numpy as np
import onnx

from ..partition.partitioner import GIVEN_BACK
from .kit_cases import (
    CHAIN,
    CPU_NAME,
    FAILED,
    FULL,
    NOT_EXERCISED,
    PARTIAL,
    PASSED,
    CaseResult,
    ConformanceFailure,
    ScanEntry,
    _chain_input,
    _chain_model,
    _compare_expected,
    _copy_samples,
    _flipped,
    _helper_registered,
    _is_random,
    _member_name,
    _non_convex_witness,
    _short,
    _successors,
    _tensor_dtypes,
    case_location,
)

__all__ = ["CHAIN", "FAILED", "FULL", "NOT_EXERCISED", "PARTIAL", "PASSED", "CaseResult", "ConformanceFailure",
           "ConformanceKit", "ScanEntry"]

logger = logging.getLogger("runtime_core.testing")


class ConformanceKit:
    """Checks one installed provider (by ORT name or alias) against the plugin contract.

    ``options`` are the provider options every session of the kit passes to it
    (strings, as in ORT). ``folders`` and ``pattern`` select the ONNX backend cases
    (see :func:`runtime_core.conformance.cases.load_cases`); ``tolerances`` overrides
    :data:`runtime_core.testing.compare.DEFAULT_TOLERANCES` per dtype name; ``op_tolerances``
    maps an op (``"DFT"``, ``"com.microsoft::Attention"``) to ``(rtol, atol)``, the least
    tolerance of every float output of a model with that op (see
    :func:`runtime_core.testing.compare.tolerances_for_ops`), and loosens the case's own
    expected-output tolerance the same way; ``threads``
    is the number of threads of the concurrency check; a case that gives no answer
    within ``case_timeout`` seconds fails as a hang (a native crash of the provider
    still ends the process: run the kit with ``pytest -v`` to see the last case).

    A failing case's message ends with where its model and data sets are (under
    :func:`runtime_core.conformance.cases.cache_root`, ``$RUNTIME_CORE_CACHE``), so that it
    can be loaded and run alone.
    """

    def __init__(self, provider: str, options: Mapping[str, str] | None = None, *,
                 folders: Iterable[str] = ("node",), pattern: str | None = None,
                 tolerances: Mapping[str, tuple[float, float]] | None = None, threads: int = 4,
                 case_timeout: float = 120.0,
                 op_tolerances: Mapping[str, tuple[float, float]] | None = None):
        self.provider = provider
        self.options = {str(k): str(v) for k, v in (options or {}).items()}
        self.folders = tuple(folders)
        self.pattern = pattern
        self.tolerances = dict(tolerances or {})
        self.op_tolerances = {str(k): (float(v[0]), float(v[1])) for k, v in (op_tolerances or {}).items()}
        self.threads = max(2, int(threads))
        self.case_timeout = float(case_timeout)
        self.results: dict[str, dict] = {FULL: {}, PARTIAL: {}, CHAIN: {}}
        self.checks: dict[str, str] = {}   # check name -> "passed" or the failure message
        self._scan: list[ScanEntry] | None = None
        self._chains: dict[str, CaseResult] | None = None
        self._record = None
        self._instance = None

    # -- identity ---------------------------------------------------------------
    @property
    def record(self):
        """The registry record of the provider (``None`` when no plugin provides it)."""
        if self._record is None:
            from ..plugin.registry import get_registry

            self._record = get_registry().lookup(self.provider)
        return self._record

    @property
    def name(self) -> str:
        """The provider's ORT-style name (the name given when it is not installed)."""
        rec = self.record
        return rec.name if rec is not None else self.provider

    def _entry(self):
        return (self.name, dict(self.options))

    def _note(self, check: str, fn):
        try:
            out = fn()
        except ConformanceFailure as exc:
            self.checks[check] = str(exc)
            raise
        self.checks[check] = PASSED
        return out

    # -- discovery and probe ----------------------------------------------------
    def check_discovery(self) -> None:
        """The provider's plugin was found, loaded, and its provider is available here."""
        self._note("discovery", self._check_discovery)

    def _check_discovery(self) -> None:
        from ..plugin.registry import API_VERSION, get_registry

        reg = get_registry()
        rec = self.record
        if rec is None:
            known = ", ".join(f"{r.name} ({r.alias})" for r in reg.loaded()) or "none"
            broken = ", ".join(f"{r.alias}: {r.status}" for r in reg.records if r.status != "loaded")
            raise ConformanceFailure(
                f"no installed plugin provides {self.provider!r}: is its distribution installed, with an "
                f"entry point in the group 'runtime_core.providers'? Installed providers: {known}"
                + (f"; plugins that failed to load: {broken}" if broken else ""))
        if rec.status != "loaded":
            raise ConformanceFailure(f"the plugin {rec.alias!r} did not load ({rec.status}): {rec.reason}"
                                     + (f" [runtime-core plugin API {API_VERSION}]"
                                        if rec.status == "api-mismatch" else ""))
        cls = rec.cls
        problems = []
        from importlib import metadata

        from ..plugin.registry import ENTRY_POINT_GROUP

        eps = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.value == rec.entry_point]
        if eps and all(ep.name != cls.alias for ep in eps):
            problems.append(f"alias {cls.alias!r} differs from its entry-point name {eps[0].name!r}")
        from packaging.utils import canonicalize_name

        dists = {ep.dist.metadata["Name"] for ep in eps if getattr(ep, "dist", None) is not None}
        if dists and canonicalize_name(cls.distribution) not in {canonicalize_name(d) for d in dists}:
            problems.append(f"distribution {cls.distribution!r} is not the installed distribution "
                            f"{sorted(dists)[0]!r} that ships it")
        for meth in ("allocate", "copy_to_device", "copy_to_host", "synchronize"):
            if not callable(getattr(cls, meth, None)):
                problems.append(f"it has no {meth}() method")
        if problems:
            raise ConformanceFailure(f"{rec.name}: " + "; ".join(problems))
        if not rec.available:
            raise ConformanceFailure(f"{rec.name} is installed but unavailable here: {rec.reason}")
        cpu = reg.lookup(CPU_NAME)
        if cpu is None or cpu.status != "loaded" or not cpu.available:
            raise ConformanceFailure("the CPU provider (the fallback, and the kit's reference) is not "
                                     f"available: {cpu.reason if cpu else 'runtime-provider-cpu is not installed'}")
        import runtime_core as rt

        if rec.name not in rt.get_available_providers():
            raise ConformanceFailure(f"{rec.name} is not listed by get_available_providers()")

    def check_probe(self) -> None:
        """``probe()`` never raises, answers the same each time, and explains unavailability."""
        self._note("probe", self._check_probe)

    def _check_probe(self) -> None:
        rec = self.record
        if rec is None or rec.cls is None:
            raise ConformanceFailure(f"{self.provider!r} is not loaded, so probe() cannot be called "
                                     f"({rec.reason if rec else 'not installed'})")
        answers = []
        for _ in range(3):
            try:
                res = rec.cls.probe()
            except BaseException as exc:  # noqa: BLE001 - this is what the check is about
                if isinstance(exc, KeyboardInterrupt):
                    raise
                raise ConformanceFailure(f"{rec.name}.probe() raised {_short(exc)}; probe() must "
                                         "return ProbeResult(False, reason) instead") from exc
            if isinstance(res, dict):
                res = type("P", (), res)
            available = getattr(res, "available", None)
            if not isinstance(available, (bool, np.bool_)):
                raise ConformanceFailure(f"{rec.name}.probe() returned {res!r}: it needs a bool "
                                         "'available' (return runtime_core.plugin.ProbeResult)")
            reason = getattr(res, "reason", "")
            if not available and not (isinstance(reason, str) and reason.strip()):
                raise ConformanceFailure(f"{rec.name}.probe() says unavailable without a reason")
            devices = getattr(res, "devices", [])
            if not isinstance(devices, (list, tuple)):
                raise ConformanceFailure(f"{rec.name}.probe() devices is {type(devices).__name__}, "
                                         "not a list")
            answers.append(bool(available))
        if len(set(answers)) != 1:
            raise ConformanceFailure(f"{rec.name}.probe() answered {answers} in three calls")

    # -- capability -------------------------------------------------------------
    def _provider(self):
        if self._instance is None:
            self.check_discovery()
            try:
                self._instance = self.record.cls(dict(self.options))
            except Exception as exc:
                raise ConformanceFailure(f"{self.name}({self.options!r}) raised {_short(exc)}") from exc
        return self._instance

    def _cpu(self):
        if getattr(self, "_cpu_instance", None) is None:
            from ..plugin.registry import get_registry

            self._cpu_instance = get_registry().lookup(CPU_NAME).cls({})
        return self._cpu_instance

    def scan(self) -> list[ScanEntry]:
        """Ask the provider about every selected case's model (once; the result is cached)."""
        if self._scan is None:
            from ..conformance.cases import load_cases

            prov = self._provider()
            cases = load_cases(folders=list(self.folders), pattern=self.pattern)
            self._scan = [self._scan_guarded(prov, c) for c in cases]
        return self._scan

    def _scan_guarded(self, prov, case) -> ScanEntry:
        try:
            return self._scan_case(prov, case)
        except Exception as exc:  # an answer so malformed that checking it raised
            logger.debug("scan of %s failed:\n%s", case.id, traceback.format_exc())
            return ScanEntry(case, violations=[f"its capability answer could not be checked: {_short(exc)}"])

    def _scan_case(self, prov, case) -> ScanEntry:
        from ..graph import Graph, load_model
        from ..plugin.contract import GraphView

        entry = ScanEntry(case)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model, _ = load_model(str(case.model_path))
                graph = Graph(model)
        except Exception as exc:  # the core itself cannot load it: not the provider's business
            entry.error = _short(exc)
            return entry
        cache: dict = {}
        views = [graph.node_view(n, i, cache) for i, n in enumerate(graph.nodes)]
        from ..partition.partitioner import _ValueMap  # what the partitioner hands providers

        values = _ValueMap(graph, cache)
        extra = {"ir_version": graph.ir_version, "type_lookup": graph.type_of}  # as a session's views
        entry.nodes = views
        entry.random = next((f"{v.name} ({v.op_type})" for v in views if _is_random(v)), "")
        first = self._ask(prov, GraphView(views, values, graph.opsets, **extra), entry, "")
        if first is None:
            return entry
        claims, declined = first
        index = {v.name: i for i, v in enumerate(views)}
        taken: set[str] = set()
        succ = None
        for claim in claims:
            is_single = isinstance(claim, str) or hasattr(claim, "op_type")
            try:
                members = [claim] if is_single else list(claim)
            except TypeError:
                entry.violations.append(f"claim {claim!r} is neither a NodeView nor a sequence of them")
                continue
            names = [_member_name(m) for m in members]
            bad = [n for n in names if n not in index]
            if bad:
                entry.violations.append(f"claimed node(s) {bad} that were not offered")
                continue
            dup = [n for n in names if n in taken] + [n for n, c in Counter(names).items() if c > 1]
            if dup:
                entry.violations.append(f"claimed node(s) {sorted(set(dup))} more than once")
                continue
            if not is_single and len(names) > 1:
                succ = succ if succ is not None else _successors(views)
                w = _non_convex_witness({index[n] for n in names}, succ)
                if w is not None:
                    entry.violations.append(
                        f"group claim {names} is not convex: a path leaves it and re-enters it "
                        f"through node {views[w].name!r} ({views[w].op_type})")
                    continue
                entry.groups.append(names)
            taken.update(names)
            entry.claimed.extend(names)
        for name, why in declined.items():
            if name not in index:
                entry.violations.append(f"declined node {name!r}, which was not offered")
            elif name in taken:
                entry.violations.append(f"node {name!r} is both claimed and declined ({why!r})")
            elif not isinstance(why, str) or not why.strip():
                entry.unexplained.append(name)
        entry.declined = {k: v for k, v in declined.items() if k in index and k not in taken}
        for v in views:
            if v.name not in taken and v.name not in declined:
                entry.unexplained.append(v.name)
        rest = [v for v in views if v.name not in taken]
        if taken and rest:  # can the fallback run the rest? (else the case cannot run at all)
            try:
                cpu_cap = self._cpu().get_capability(GraphView(rest, values, graph.opsets, **extra))
                cpu_took = {_member_name(c) for c in cpu_cap.claims}
                entry.cpu_declined = {v.name: cpu_cap.declined.get(v.name, "no reason given")
                                      for v in rest if v.name not in cpu_took}
            except Exception as exc:  # noqa: BLE001 - the CPU provider's problem, not this one's
                entry.cpu_declined = {"*": f"CPU get_capability raised {_short(exc)}"}
        # the same question twice gets the same answer
        second = self._ask(prov, GraphView(views, values, graph.opsets, **extra), entry, " (asked again)")
        if second is not None:
            again = sorted(_member_name(m) for c in second[0] for m in (
                [c] if isinstance(c, str) or hasattr(c, "op_type") else list(c)))
            if again != sorted(entry.claimed) and not entry.violations:
                entry.violations.append(f"asked twice, it claimed {sorted(entry.claimed)} then {again}")
        # a view from which a higher-priority provider took the first node
        if len(views) > 1:
            rest = views[1:]
            third = self._ask(prov, GraphView(rest, values, graph.opsets, **extra), entry,
                              f" (offered all nodes but {views[0].name!r})")
            if third is not None:
                offered = {v.name for v in rest}
                for c in third[0]:
                    members = [c] if isinstance(c, str) or hasattr(c, "op_type") else list(c)
                    stray = [_member_name(m) for m in members if _member_name(m) not in offered]
                    if stray:
                        entry.violations.append(f"offered all nodes but {views[0].name!r}, it claimed "
                                                f"{stray}, which were not offered")
        return entry

    def _ask(self, prov, gv, entry: ScanEntry, when: str):
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                cap = prov.get_capability(gv)
        except Exception as exc:
            entry.violations.append(f"get_capability raised {_short(exc)}{when}")
            return None
        if isinstance(cap, tuple) and len(cap) == 2:
            claims, declined = cap
        else:
            claims, declined = getattr(cap, "claims", None), getattr(cap, "declined", None)
        if not isinstance(claims, (list, tuple)) or not isinstance(declined, Mapping):
            entry.violations.append(f"get_capability returned {type(cap).__name__}{when}, not an object "
                                    "with a list 'claims' and a dict 'declined' (return "
                                    "runtime_core.plugin.Capability)")
            return None
        return list(claims), dict(declined)

    def check_capability(self) -> None:
        """Every capability answer over the selected cases keeps the contract."""
        self._note("capability", self._check_capability)

    def _check_capability(self) -> None:
        bad = [(e, v) for e in self.scan() for v in e.violations]
        if bad:
            lines = [f"  {e.name}: {v}" for e, v in bad[:25]]
            more = f"\n  ... and {len(bad) - 25} more" if len(bad) > 25 else ""
            raise ConformanceFailure(f"{self.name}.get_capability broke the contract {len(bad)} time(s):\n"
                                     + "\n".join(lines) + more)

    def check_decline_reasons(self) -> None:
        """Every offered node the provider does not claim has a non-empty reason."""
        self._note("decline reasons", self._check_decline_reasons)

    def _check_decline_reasons(self) -> None:
        bad = [(e, n) for e in self.scan() for n in e.unexplained]
        if bad:
            ops = Counter(next((v.op_type for v in e.nodes if v.name == n), "?") for e, n in bad)
            lines = ", ".join(f"{op} ({c})" for op, c in ops.most_common(15))
            raise ConformanceFailure(
                f"{self.name} declined {len(bad)} node(s) without a reason (put one in "
                f"Capability.declined[node.name]); by op: {lines}; first in {bad[0][0].name}: {bad[0][1]!r}")

    # -- running cases ------------------------------------------------------------
    def claimed_cases(self) -> list[ScanEntry]:
        """Cases whose every node the provider claims."""
        return [e for e in self.scan() if e.full and not e.violations and not e.random]

    def partial_cases(self) -> list[ScanEntry]:
        """Cases of which the provider claims some nodes, not all."""
        return [e for e in self.scan() if e.partial and e.runnable and not e.violations and not e.random]

    def _session(self, model_or_path, providers):
        import runtime_core as rt

        so = rt.SessionOptions()
        so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
        src = model_or_path.SerializeToString() if isinstance(model_or_path, onnx.ModelProto) \
            else str(model_or_path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return rt.InferenceSession(src, so, providers=providers)

    @staticmethod
    def _feeds(sess, model: onnx.ModelProto, inputs: list) -> dict:
        names = [i.name for i in model.graph.input]
        feedable = {i.name for i in sess.get_inputs()}
        return {names[k]: v for k, v in enumerate(inputs) if k < len(names) and names[k] in feedable}

    def _run(self, sess, model, inputs):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return sess.run(None, self._feeds(sess, model, inputs))

    def tolerances_for(self, entry: ScanEntry) -> dict[str, tuple[float, float]]:
        """The per-dtype tolerances of ``entry``'s case: the kit's, loosened by ``op_tolerances``."""
        from .compare import tolerances_for_ops

        return tolerances_for_ops(self.tolerances, self.op_tolerances, {(n.domain, n.op_type) for n in entry.nodes})

    def _compare(self, expected_cpu, expected_file, got, entry: ScanEntry) -> tuple[bool, str, str]:
        """(passed, reference, message): the CPU result or the case's expected output must match."""
        from .compare import Mismatch, assert_same, tolerances_for_ops

        case = entry.case
        table = self.tolerances_for(entry)
        msgs = []
        if expected_cpu is not None:
            try:
                for k, (e, a) in enumerate(zip(expected_cpu, got)):
                    assert_same(e, a, table, f"output {k}")
                return True, "cpu", ""
            except Mismatch as exc:
                msgs.append(f"vs the CPU provider: {exc}")
        if expected_file is not None:
            loose = tolerances_for_ops({"x": (case.rtol, case.atol)}, self.op_tolerances,
                                       {(n.domain, n.op_type) for n in entry.nodes})["x"]
            try:
                _compare_expected(expected_file, got, *loose)
                return True, "expected", ""
            except AssertionError as exc:
                msgs.append(f"vs the case's expected output: {exc}")
        return False, "", "; ".join(msgs)

    def run_case(self, entry: ScanEntry) -> CaseResult:
        """Run one claimed or partial case on the provider with CPU fallback; never raises."""
        kind = FULL if entry.full else PARTIAL
        res = self._guarded(entry, kind, lambda: self._run_case(entry, kind))
        self.results[kind][entry.id] = res
        return res

    def _guarded(self, entry: ScanEntry, kind: str, fn) -> CaseResult:
        """``fn()`` in a worker thread: an exception, or no answer within ``case_timeout``, is a failure."""
        box: dict = {}

        def work():
            try:
                box["res"] = fn()
            except Exception as exc:
                logger.debug("case %s failed:\n%s", entry.id, traceback.format_exc())
                box["res"] = CaseResult(entry.id, kind, FAILED, _short(exc))

        t = threading.Thread(target=work, name=f"kit-{entry.name}", daemon=True)
        t.start()
        t.join(self.case_timeout)
        if t.is_alive():
            res = CaseResult(entry.id, kind, FAILED, f"did not finish within {self.case_timeout:g} s "
                                                     "(a hang; it is left running in the background)")
        else:
            res = box["res"]
        if res.outcome == FAILED and not res.location:
            res.location = case_location(entry.case, chained=kind == CHAIN)
        return res

    def _run_case(self, entry: ScanEntry, kind: str) -> CaseResult:
        case = entry.case
        model = case.load_model()
        sess = self._session(case.model_path, [self._entry(), "cpu"])
        placed = {n.name: n.provider for n in sess.get_partition_report().nodes}
        mine = {n for n, p in placed.items() if p == self.name}
        claimed = set(entry.claimed)
        why = {n.name: n.declined.get(self.name, "") for n in sess.get_partition_report().nodes}
        back = {n for n in claimed - mine if why.get(n, "").startswith(GIVEN_BACK)}
        claimed -= back  # the provider's own partition shaping gave them back: not a contract break
        if not claimed and back:
            return CaseResult(entry.id, kind, NOT_EXERCISED, f"{self.name} gave back every node it claimed "
                                                             f"(partition shaping): {why[sorted(back)[0]]}")
        if mine != claimed:
            lost = sorted(claimed - mine)
            extra = sorted(mine - claimed)
            detail = "; ".join(f"{n}: {why.get(n) or 'no reason'}" for n in lost[:5])
            return CaseResult(entry.id, kind, FAILED,
                              f"the session placed {sorted(mine)} on {self.name}, but get_capability "
                              f"claimed {sorted(claimed)}" + (f" (not placed: {detail})" if lost else "")
                              + (f" (placed unclaimed: {extra})" if extra else ""))
        try:
            cpu = self._session(case.model_path, ["cpu"])
        except Exception as exc:  # the CPU provider cannot run it: the expected output decides
            logger.debug("CPU reference of %s unavailable: %s", entry.id, exc)
            cpu = None
        data = case.data_sets()
        if not data:
            return CaseResult(entry.id, kind, NOT_EXERCISED, "the case has no data set")
        refs = set()
        for i, (inputs, expected) in enumerate(data):
            got = self._run(sess, model, inputs)
            ref = None
            if cpu is not None:
                try:
                    ref = self._run(cpu, model, inputs)
                except Exception as exc:
                    logger.debug("CPU run of %s failed: %s", entry.id, exc)
            ok, which, msg = self._compare(ref, expected, got, entry)
            if not ok:
                return CaseResult(entry.id, kind, FAILED, f"data set {i}: {msg}")
            refs.add(which)
        return CaseResult(entry.id, kind, PASSED, reference="+".join(sorted(refs)))

    def check_case(self, entry: ScanEntry) -> None:
        """Run one case and raise :class:`ConformanceFailure` when it fails (the message says
        where the case's model and data are)."""
        res = self.run_case(entry)
        if res.outcome == FAILED:
            raise ConformanceFailure(f"{entry.name} ({res.kind}): {res.message}\n  {res.location}")

    # -- fallback chains ------------------------------------------------------------
    def chain_cases(self) -> list[ScanEntry]:
        """Claimed one-node cases that chain (an output of the type and shape of an input).

        One per qualified op and dtype, so that a provider with many claims stays quick.
        """
        seen, out = set(), []
        for e in self.claimed_cases():
            if len(e.nodes) != 1 or _chain_input(e.nodes[0]) is None:
                continue
            n = e.nodes[0]
            key = (n.qualified_op, str(n.output_info[0].dtype))
            if key not in seen:
                seen.add(key)
                out.append(e)
        return out

    def run_chains(self) -> dict[str, CaseResult]:
        """Run every fallback chain (once, with the kit's helper provider registered)."""
        if self._chains is None:
            self._chains = {}
            entries = self.chain_cases()
            if entries:
                with _helper_registered():
                    for e in entries:
                        res = self._guarded(e, CHAIN, lambda e=e: self._run_chain(e))
                        self._chains[e.id] = res
                        self.results[CHAIN][e.id] = res
        return self._chains

    def _run_chain(self, entry: ScanEntry) -> CaseResult:
        from .split import ALIAS

        case = entry.case
        model = case.load_model()
        chained, names = _chain_model(model, entry.nodes[0])
        sess = self._session(chained, [(ALIAS, {"claim": names[1]}), self._entry(), "cpu"])
        rep = sess.get_partition_report()
        placed = {n.name: n.provider for n in rep.nodes}
        if placed.get(names[0]) != self.name or placed.get(names[2]) != self.name:
            why = {n.name: n.declined.get(self.name, "") for n in rep.nodes}
            return CaseResult(entry.id, CHAIN, NOT_EXERCISED,
                              f"{self.name} did not take both outer nodes when the middle one was taken "
                              f"by another provider: {placed} ({why.get(names[0]) or why.get(names[2])})")
        if getattr(self.record.cls, "device_type", "cpu") != "cpu" and not rep.copies:
            return CaseResult(entry.id, CHAIN, FAILED, "no device copies were planned between "
                                                       f"{self.name} and the host provider")
        cpu = self._session(chained, ["cpu"])
        from .compare import Mismatch, assert_same

        for i, (inputs, _) in enumerate(case.data_sets()):
            got = self._run(sess, chained, inputs)
            ref = self._run(cpu, chained, inputs)
            try:
                for k, (e, a) in enumerate(zip(ref, got)):
                    assert_same(e, a, self.tolerances_for(entry), f"output {k}")
            except Mismatch as exc:
                return CaseResult(entry.id, CHAIN, FAILED, f"data set {i}, {self.name} -> host -> "
                                                           f"{self.name}: {exc}")
        return CaseResult(entry.id, CHAIN, PASSED, reference="cpu")

    def check_chain(self, entry: ScanEntry) -> CaseResult:
        """Raise :class:`ConformanceFailure` when the fallback chain built from ``entry`` fails."""
        res = self.run_chains().get(entry.id)
        if res is None:
            raise ConformanceFailure(f"{entry.name} is not a chain case")
        if res.outcome == FAILED:
            raise ConformanceFailure(f"{entry.name} (chain): {res.message}\n  {res.location}")
        return res

    # -- concurrency -------------------------------------------------------------
    def check_concurrency(self, max_cases: int = 8, repeats: int = 4) -> None:
        """Sessions run from several threads at once give their single-threaded results."""
        self._note("concurrency", lambda: self._check_concurrency(max_cases, repeats))

    def _check_concurrency(self, max_cases: int, repeats: int) -> None:
        from .compare import Mismatch, assert_same

        jobs = []
        ops = set()
        for e in self.claimed_cases():
            key = tuple(sorted(n.op_type for n in e.nodes))
            if key in ops:
                continue
            try:
                model = e.case.load_model()
                data = e.case.data_sets()
                if not data:
                    continue
                sess = self._session(e.case.model_path, [self._entry(), "cpu"])
                # two different feeds, so that state shared between runs shows in the results
                variants = [data[0][0], _flipped(data[0][0])]
                wants = [self._run(sess, model, v) for v in variants]
            except Exception:  # a case that fails alone is reported by its own check
                continue
            ops.add(key)
            jobs.append((e, sess, model, variants, wants))
            if len(jobs) >= max_cases:
                break
        if not jobs:
            raise ConformanceFailure(f"no claimed case runs on {self.name}, so concurrency cannot be checked")
        errors: list[str] = []
        lock = threading.Lock()
        barrier = threading.Barrier(self.threads)

        def work(t: int):
            try:
                barrier.wait(timeout=30)
            except threading.BrokenBarrierError:
                pass
            for r in range(repeats):
                for j in range(len(jobs)):
                    e, sess, model, variants, wants = jobs[(j + t + r) % len(jobs)]
                    inputs, want = variants[(t + r) % 2], wants[(t + r) % 2]
                    try:
                        got = self._run(sess, model, inputs)
                        for k, (a, b) in enumerate(zip(want, got)):
                            assert_same(a, b, self.tolerances_for(e), f"output {k}")
                    except (Mismatch, Exception) as exc:
                        with lock:
                            errors.append(f"{e.name} (thread {t}): {_short(exc)}")

        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(work, range(self.threads)))
        if errors:
            raise ConformanceFailure(f"{len(errors)} concurrent run(s) of {len(jobs)} session(s) on "
                                     f"{self.threads} threads differed from the single-threaded result "
                                     "or failed:\n  " + "\n  ".join(errors[:10]))

    # -- device copies -------------------------------------------------------------
    def copy_dtypes(self) -> list[np.dtype]:
        """Every tensor dtype read or written by a node the provider claims."""
        seen = set()
        for e in self.scan():
            if e.error or e.violations:
                continue
            claimed = set(e.claimed)
            for n in e.nodes:
                if n.name in claimed:
                    seen |= _tensor_dtypes(n)
        return sorted(seen, key=lambda d: d.name)

    def check_copies(self, dtype) -> None:
        """Host -> device -> host copies of ``dtype`` arrays give back the same bits."""
        dtype = np.dtype(dtype)
        self._note(f"copies {dtype.name}", lambda: self._check_copies(dtype))

    def _check_copies(self, dtype: np.dtype) -> None:
        prov = self._provider()
        problems = []
        for label, arr in _copy_samples(dtype):
            try:
                before = arr.copy()
                dev = prov.copy_to_device(arr)
                if arr.size > 1 and arr.dtype.kind not in "OUS" and arr.flags.writeable \
                        and getattr(self.record.cls, "device_type", "cpu") != "cpu":
                    # the device copy must not alias the host array it came from
                    arr[...] = arr.reshape(-1)[0]
                host = prov.copy_to_host(dev)
                prov.synchronize()
            except Exception as exc:
                problems.append(f"{label}: {_short(exc)}")
                continue
            if not isinstance(host, np.ndarray):
                problems.append(f"{label}: copy_to_host returned {type(host).__name__}, not a numpy array")
                continue
            if host.dtype != dtype or host.shape != before.shape:
                problems.append(f"{label}: came back as {host.dtype} {list(host.shape)}")
                continue
            want, got = before.reshape(-1), host.reshape(-1)
            if dtype.kind in "OUS":
                diff = [i for i, (a, b) in enumerate(zip(want.tolist(), got.tolist())) if a != b]
            else:  # bit for bit: NaN payloads and -0.0 included
                size = dtype.itemsize
                wb = np.ascontiguousarray(want).view(np.uint8).reshape(want.size, size)
                gb = np.ascontiguousarray(got).view(np.uint8).reshape(got.size, size)
                diff = np.flatnonzero(np.any(wb != gb, axis=1)).tolist()
            if diff:
                i = diff[0]
                problems.append(f"{label}: {len(diff)} of {want.size} values changed on the way "
                                f"(element {i}: {want[i]!r} came back as {got[i]!r})")
        try:
            t = prov.allocate((2, 3), dtype)
            host = prov.copy_to_host(t)
            if not isinstance(host, np.ndarray) or host.shape != (2, 3) or host.dtype != dtype:
                problems.append(f"allocate((2, 3), {dtype}) then copy_to_host gave "
                                f"{getattr(host, 'dtype', type(host).__name__)} {list(np.shape(host))}")
        except Exception as exc:
            problems.append(f"allocate((2, 3), {dtype}): {_short(exc)}")
        if problems:
            raise ConformanceFailure(f"device copies of {dtype} on {self.name} do not round-trip:\n  "
                                     + "\n  ".join(problems))

    # -- everything ---------------------------------------------------------------
    def run_all(self) -> bool:
        """Run every check without pytest; returns True when all passed (see :meth:`summary`)."""
        ok = True
        for check in (self.check_discovery, self.check_probe):
            try:
                check()
            except ConformanceFailure:
                return False
        for check in (self.check_capability, self.check_decline_reasons):
            try:
                check()
            except ConformanceFailure:
                ok = False
        for e in self.claimed_cases() + self.partial_cases():
            ok &= self.run_case(e).outcome != FAILED
        ok &= all(r.outcome != FAILED for r in self.run_chains().values())
        try:
            self.check_concurrency()
        except ConformanceFailure:
            ok = False
        for dt in self.copy_dtypes():
            try:
                self.check_copies(dt)
            except ConformanceFailure:
                ok = False
        return ok

    def summary(self) -> str:
        """What was checked: claimed ops, passed, failed, declined, and why any case was not run."""
        from .kit_report import summary

        return summary(self)
