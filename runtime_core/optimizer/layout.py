"""ORT_ENABLE_ALL: channels-last layout for the nodes whose provider asks for it.

A provider that prefers NHWC for some nodes says so with
``ExecutionProvider.preferred_layout(node) -> "NHWC" | None`` (plugin API 1.1,
optional). For each 4-D ``Conv``, ``MaxPool`` (without the Indices output),
``AveragePool`` or ``GlobalAveragePool`` that a trial partition gives to such a
provider, the node becomes ``Transpose(NCHW->NHWC) -> runtime_core.nhwc::<Op> ->
Transpose(NHWC->NCHW)``; back-to-back transposes between consecutive NHWC nodes then
cancel. The ``runtime_core.nhwc`` ops (documented in docs/architecture.md) take and
return NHWC activations, keep the ONNX op's weights (``Conv`` W stays OIHW), carry every
attribute of the original node resolved, plus ``since_version``: the ai.onnx schema
version whose semantics they follow. The CPU provider has reference kernels for them,
so a model optimized for one provider still runs anywhere.
"""

from __future__ import annotations

from contextvars import ContextVar

import onnx

from ..graph.ir import Graph
from .editor import ALL, FROZEN, Editor, Pass

NHWC_DOMAIN = "runtime_core.nhwc"
LAYOUT_OPS = frozenset({"Conv", "MaxPool", "AveragePool", "GlobalAveragePool"})
TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]

#: the session's provider instances while ``optimize`` runs (the layout pass asks them)
PROVIDERS: ContextVar[tuple] = ContextVar("runtime_core_optimizer_providers", default=())


class LayoutTransformation(Pass):
    """NHWC variants of the layout-sensitive nodes whose provider prefers channels-last."""

    name = "LayoutTransformation"
    level = ALL

    def apply(self, graph: Graph) -> int:
        providers = [p for p in PROVIDERS.get() if callable(getattr(p, "preferred_layout", None))]
        if not providers:
            return 0
        wanted = self._wanted(graph, list(PROVIDERS.get()))
        if not wanted:
            return 0
        ed = Editor(graph, self.name)
        count = 0
        # these are exactly the nodes another provider runs, which the fusions leave alone
        token = FROZEN.set(frozenset())
        try:
            for n in list(graph.nodes):
                if n.name not in wanted or not ed.alive(n):
                    continue
                if self._rewrite(ed, n):
                    count += 1
        finally:
            FROZEN.reset(token)
        if count:
            from .elimination import TransposeElimination

            TransposeElimination().apply(graph)  # NCHW->NHWC right after NHWC->NCHW cancels
            Editor(graph, self.name).dead_code()  # the NHWC->NCHW transposes nothing reads now
        return count

    @staticmethod
    def _wanted(graph: Graph, providers: list) -> set[str]:
        from ..partition import partition_graph

        try:
            _, report = partition_graph(graph, providers)
        except Exception:  # noqa: BLE001 - the session's own partition reports what is wrong
            return set()
        by_name = {p.name: p for p in providers}
        cache: dict = {}
        views = {n.name: graph.node_view(n, i, cache) for i, n in enumerate(graph.nodes)}
        out = set()
        for entry in report.nodes:
            view = views.get(entry.name)
            prov = by_name.get(entry.provider)
            ask = getattr(prov, "preferred_layout", None)
            if view is None or not callable(ask) or view.domain or view.op_type not in LAYOUT_OPS:
                continue
            try:
                layout = ask(view)
            except Exception:  # noqa: BLE001 - a provider bug means no layout change
                layout = None
            if layout == "NHWC":
                out.add(entry.name)
        return out

    @staticmethod
    def _rewrite(ed: Editor, n) -> bool:
        x, y = n.inputs[0], n.outputs[0]
        shape_x, shape_y = ed.shape(x), ed.shape(y)
        if shape_x is None or len(shape_x) != 4 or any(o for o in n.outputs[1:]) or n.since_version is None:
            return False
        attrs = [onnx.helper.make_attribute(k, v) for k, v in n.attrs.items() if v is not None]
        attrs.append(onnx.helper.make_attribute("since_version", int(n.since_version)))
        ed.ensure_opset(NHWC_DOMAIN, 1)
        xt, yt = ed.fresh(x + "_nhwc"), ed.fresh(y + "_nhwc")
        t_in = ed.g.make_node("Transpose", [x], [xt], name=ed.fresh(n.name + "_to_nhwc"),
                              proto_attrs=[onnx.helper.make_attribute("perm", TO_NHWC)])
        core = ed.g.make_node(n.op_type, [xt, *n.inputs[1:]], [yt], name=ed.fresh(n.name + "_nhwc"),
                              domain=NHWC_DOMAIN, proto_attrs=attrs)
        t_out = ed.g.make_node("Transpose", [yt], [y], name=ed.fresh(n.name + "_to_nchw"),
                               proto_attrs=[onnx.helper.make_attribute("perm", TO_NCHW)])
        dt = ed.dtype(x)
        ed.set_type(xt, dt, [shape_x[i] for i in TO_NHWC])
        if shape_y is not None and len(shape_y) == 4:
            ed.set_type(yt, ed.dtype(y) or dt, [shape_y[i] for i in TO_NHWC])
        if ed.replace([n], [t_in, core, t_out]):
            ed.log("%s -> NHWC (%s asks for channels-last)", n.name, NHWC_DOMAIN)
            return True
        return False
