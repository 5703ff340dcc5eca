"""The numexpr execution provider and its plugin hook.

runtime-core loads this module through the entry point ``numexpr`` in the group
``runtime_core.providers``. Importing it is cheap: numexpr itself is imported by
``probe()`` (to see that it works) and by ``compile()``.

Provider options (strings, as in ORT):

* ``min_elements``: decline nodes whose output has fewer elements than this
  (default ``1048576``; ``0`` takes every elementwise node). numexpr pays for its
  call overhead on large tensors only; with a positive value, nodes whose size is
  not known at session creation are declined too;
* ``transcendentals``: ``auto`` (default: claim exp, log, tanh, sigmoid, pow, the
  trigonometric ops ... only when numexpr uses Intel VML, since numpy's own SIMD
  versions are faster than numexpr's scalar ones), ``always`` or ``never``;
* ``exclude_ops``: comma-separated op types to leave to the next provider.
"""

from __future__ import annotations

import numpy as np

from runtime_core.plugin import Capability, ExecutionProvider, ProbeResult, hookimpl

from ._version import __version__
from .ops import OPS, TRANSCENDENTAL

OPTIONS = ("min_elements", "transcendentals", "exclude_ops")
DEFAULT_MIN_ELEMENTS = 1 << 20


def decline_reason(node, min_elements: int = 0) -> str | None:
    """Why the numexpr provider does not run ``node``, or ``None`` when it does."""
    if node.domain not in ("", "ai.onnx"):
        return f"op {node.domain}::{node.op_type} is not elementwise in numexpr's sense"
    spec = OPS.get(node.op_type)
    if spec is None:
        return f"op {node.op_type} is not one of the elementwise ops numexpr fuses"
    if node.since_version not in spec.versions:
        return (f"{node.op_type} version {node.since_version} is not implemented "
                f"(versions: {', '.join(map(str, spec.versions))})")
    if len(node.inputs) != spec.arity or not all(node.inputs) or len(node.outputs) != 1:
        return f"{node.op_type} with {len(node.inputs)} input(s) is not implemented"
    infos = list(node.input_info) + list(node.output_info)
    for vi in infos:
        if vi is None or vi.kind != "tensor" or vi.dtype is None:
            what = "unknown" if vi is None or vi.dtype is None else f"a {vi.kind}"
            return f"{getattr(vi, 'name', '?')!r} is {what}; numexpr needs tensors of known dtype"
    data = node.input_info[1:] if spec.condition else node.input_info
    if spec.condition and np.dtype(node.input_info[0].dtype) != np.bool_:
        return "the condition of Where must be bool"
    dtypes = {np.dtype(v.dtype).name for v in data}
    if len(dtypes) != 1:
        return f"{node.op_type} on mixed dtypes {sorted(dtypes)} is not implemented"
    (dt,) = dtypes
    if dt not in spec.dtypes:
        return f"{node.op_type} on {dt} is not implemented (dtypes: {', '.join(sorted(spec.dtypes))})"
    want = "bool" if spec.output == "bool" else dt
    got = np.dtype(node.output_info[0].dtype).name
    if got != want:
        return f"{node.op_type} producing {got} from {dt} is not implemented"
    if min_elements > 0:
        shape = node.output_info[0].static_shape
        if shape is None:
            return f"the size of {node.outputs[0]!r} is not known at session creation (min_elements={min_elements})"
        n = int(np.prod(shape, dtype=np.int64))
        if n < min_elements:
            return f"{n} elements is below min_elements={min_elements} (numpy is faster on small tensors)"
    return None


class NumexprExecutionProvider(ExecutionProvider):
    """Fuses chains of elementwise ONNX nodes into numexpr programs (multi-threaded, no temporaries)."""

    name = "NumexprExecutionProvider"
    alias = "numexpr"
    version = __version__
    distribution = "runtime-provider-numexpr"
    plugin_api = ">=1.0,<2"
    device_type = "cpu"  # numexpr reads and writes numpy arrays: no copies at its boundaries

    def __init__(self, options=None):
        super().__init__(options)
        unknown = sorted(k for k in self.options if k not in OPTIONS)
        if unknown:
            raise ValueError(f"unknown numexpr provider option(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(OPTIONS)}")
        raw = str(self.options.get("min_elements", DEFAULT_MIN_ELEMENTS))
        try:
            self.min_elements = int(raw)
        except ValueError:
            raise ValueError(f"min_elements must be an integer, got {raw!r}") from None
        if self.min_elements < 0:
            raise ValueError(f"min_elements must be >= 0, got {self.min_elements}")
        self.transcendentals = str(self.options.get("transcendentals", "auto"))
        if self.transcendentals not in ("auto", "always", "never"):
            raise ValueError(f"transcendentals must be auto, always or never, got {self.transcendentals!r}")
        self.exclude_ops = {o.strip() for o in str(self.options.get("exclude_ops", "")).split(",") if o.strip()}
        bad = sorted(self.exclude_ops - set(OPS))
        if bad:
            raise ValueError(f"exclude_ops names op(s) this provider does not run: {', '.join(bad)}; "
                             f"it runs {', '.join(sorted(OPS))}")
        self._skip_transcendental = ""
        if self.transcendentals == "never":
            self._skip_transcendental = "transcendental ops are off (provider option transcendentals=never)"
        elif self.transcendentals == "auto":
            import numexpr

            if not getattr(numexpr, "use_vml", False):
                self._skip_transcendental = ("numexpr is built without Intel VML, so numpy's SIMD version is "
                                             "faster (provider option transcendentals=always claims it anyway)")

    @classmethod
    def probe(cls) -> ProbeResult:
        """Available when numexpr imports and evaluates; never raises."""
        try:
            import numexpr

            numexpr.evaluate("a + 1", local_dict={"a": np.zeros(2)})
        except Exception as exc:  # noqa: BLE001 - probe() reports, it never raises
            return ProbeResult(False, f"numexpr is not usable: {type(exc).__name__}: {exc} "
                                      "(pip install numexpr)")
        return ProbeResult(True, "", [f"host, numexpr {numexpr.__version__}, "
                                      f"{numexpr.detect_number_of_cores()} core(s)"])

    def get_options(self) -> dict[str, str]:
        """The effective options."""
        out = {"min_elements": str(self.min_elements), "transcendentals": self.transcendentals}
        if self.exclude_ops:
            out["exclude_ops"] = ",".join(sorted(self.exclude_ops))
        return out

    def get_capability(self, graph) -> Capability:
        """Claim every supported elementwise node on its own.

        Single claims, not groups: the core merges neighbouring claims into convex
        partitions (it sees the whole graph, this provider only the offered nodes),
        and :meth:`compile` fuses each partition into as few programs as it can.
        """
        cap = Capability()
        for node in graph:
            if node.op_type in self.exclude_ops:
                why = "excluded by the provider option exclude_ops"
            elif self._skip_transcendental and node.op_type in TRANSCENDENTAL:
                why = f"{node.op_type}: {self._skip_transcendental}"
            else:
                why = decline_reason(node, self.min_elements)
            if why is None:
                cap.claims.append(node)
            else:
                cap.declined[node.name] = why
        return cap

    def compile(self, partition):
        """Fuse the partition into numexpr programs (see :mod:`runtime_provider_numexpr.fusion`)."""
        from .fusion import FusedExecutable

        return FusedExecutable(partition)


@hookimpl
def runtime_core_register_providers(registrar) -> None:
    """Register :class:`NumexprExecutionProvider` (cheap: numexpr is not imported here)."""
    registrar.register(NumexprExecutionProvider)
