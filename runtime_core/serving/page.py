"""The partition picture: a layered left-to-right drawing of a session's graph as inline SVG, nodes
coloured by provider and partition, decline reasons in ``<title>`` tooltips, device copies marked;
and the self-contained HTML page around it (no external resources) with pan/zoom, node search and,
when served, a form that runs the model on random or given inputs.

Needs no web framework: ``runtime-core partition MODEL --html OUT.html`` writes the same page
offline (without the form)."""

from __future__ import annotations

import colorsys
import html
import json
from pathlib import Path

import numpy as np

NODE_W, NODE_H, GAP_X, GAP_Y, ROW_GAP = 150, 30, 60, 14, 70
#: provider hues in degrees; a provider not listed gets one from its name
_HUES = {"CPUExecutionProvider": 210, "CUDAExecutionProvider": 110, "OpenCLExecutionProvider": 30}


def _hue(provider: str) -> int:
    return _HUES.get(provider, sum(map(ord, provider)) * 47 % 360)


def partition_colours(report) -> dict[int, str]:
    """Partition id -> fill colour: the provider's hue, each of its partitions a different lightness."""
    seen: dict[str, int] = {}
    colours = {}
    for p in report.partitions:
        k = seen.get(p["provider"], 0)
        seen[p["provider"]] = k + 1
        light = (78, 66, 86, 72, 60, 82)[k % 6] / 100
        r, g, b = colorsys.hls_to_rgb(_hue(p["provider"]) / 360, light, 0.62)
        colours[p["id"]] = f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"
    return colours


#: the fewest nodes a run of repeated blocks must cover to be collapsed; the most items one run
#: becomes in the main picture (more repetitions share an item)
MIN_RUN, MAX_RUN_ITEMS = 12, 40
#: the longest block looked for (the search costs one pass over the nodes per length)
MAX_BLOCK = 2000


def repeated_blocks(ops: list[str]) -> list[tuple[int, int, int]]:
    """Runs of repeated blocks in a node sequence (execution order), as (start, block length,
    repetitions): the op sequence ``ops[start:start + length]`` occurs ``repetitions`` times in a row
    (the layers of a transformer export). Each run is the one covering the most nodes, the shortest
    block when several cover as many; then the parts before and after it are searched the same way."""
    codes = np.unique(np.asarray(ops, dtype=object).astype(str), return_inverse=True)[1] if ops else np.zeros(0)
    runs: list[tuple[int, int, int]] = []
    todo = [(0, len(ops))]
    while todo:
        lo, hi = todo.pop()
        seg = codes[lo:hi]
        best = (0, 0, 0, 0)  # (covered, -length, start, count)
        for p in range(1, min((hi - lo) // 2, MAX_BLOCK) + 1):
            eq = np.concatenate(([False], seg[:-p] == seg[p:], [False]))
            edges = np.flatnonzero(np.diff(eq.astype(np.int8)))  # starts and ends of runs of matches
            starts, counts = edges[::2], (edges[1::2] - edges[::2] + p) // p  # the periodic stretch is p longer
            if len(counts) and counts.max() >= 2:
                k = int(np.argmax(counts))
                if (int(counts[k]) * p, -p) > best[:2]:
                    best = (int(counts[k]) * p, -p, int(starts[k]), int(counts[k]))
        covered, neg, st, count = best
        if covered < MIN_RUN:
            continue
        runs.append((lo + st, -neg, count))
        todo += [(lo, lo + st), (lo + st + covered, hi)]
    return sorted(runs)


def _layout(items: list[dict]) -> tuple[int, int]:
    """Place ``items`` (topological order, ``preds``: [(item id, value)]): longest-path layers, each
    ordered by its predecessors' mean position, wrapped into rows; returns (width, height)."""
    layer: dict[str, int] = {}
    for it in items:
        layer[it["id"]] = 1 + max((layer[p] for p, _ in it["preds"] if p in layer), default=-1)
    layers: dict[int, list[dict]] = {}
    for it in items:
        layers.setdefault(layer[it["id"]], []).append(it)
    pos: dict[str, float] = {}
    for k in sorted(layers):
        row = layers[k]
        keys = {}
        for i, it in enumerate(row):
            ps = [pos[p] for p, _ in it["preds"] if p in pos]
            keys[it["id"]] = (sum(ps) / len(ps)) if ps else i
        row.sort(key=lambda it: keys[it["id"]])
        for i, it in enumerate(row):
            pos[it["id"]] = i
    # a deep graph is a long thin strip: wrap its layers into rows (as text wraps) so that the whole
    # drawing is about twice as wide as high, which a screen shows at a readable scale
    depth = max(layers) + 1 if layers else 0
    mean_band = sum(len(r) for r in layers.values()) / max(depth, 1) * (NODE_H + GAP_Y) + ROW_GAP
    per_row = max(1, min(depth, round((2 * depth * mean_band / (NODE_W + GAP_X)) ** 0.5))) if depth else 1
    top = 0
    for r0 in range(0, depth, per_row):
        ks = [k for k in range(r0, min(r0 + per_row, depth)) if k in layers]
        for k in ks:
            for i, it in enumerate(layers[k]):
                it["x"] = (k - r0) * (NODE_W + GAP_X)
                it["y"] = top + i * (NODE_H + GAP_Y)
        top += max(len(layers[k]) for k in ks) * (NODE_H + GAP_Y) + ROW_GAP
    return min(depth, per_row) * (NODE_W + GAP_X), max(top - ROW_GAP, 0)


def _edges(items: list[dict], copies: dict) -> list[dict]:
    """One edge per (source, destination, value); a value the report copies between devices, drawn
    between items of different providers, is a copy edge."""
    place = {it["id"]: it for it in items}
    edges, seen = [], set()
    for it in items:
        for p, value in it["preds"]:
            if (p, it["id"], value) in seen or p == it["id"] or p not in place:
                continue
            seen.add((p, it["id"], value))
            src = place[p]
            c = copies.get(value)
            is_copy = c is not None and src["kind"] != "input" and it.get("provider") is not None \
                and src.get("provider") is not None and src.get("provider") != it.get("provider")
            edges.append({"src": p, "dst": it["id"], "value": value, "copy": is_copy,
                          "title": (f"copy of {value}: {c.src} -> {c.dst} "
                                    f"({'dynamic size' if c.bytes is None else str(c.bytes) + ' bytes'})")
                          if is_copy and c is not None else value})
    return edges


def _view(items: list[dict], copies: dict, key: str, title: str, colours: dict, report=None) -> dict:
    width, height = _layout(items)
    return {"key": key, "title": title, "items": items, "edges": _edges(items, copies), "width": width,
            "height": height, "report": report, "colours": colours}


def _body_views(owner: dict, view, path: str, copies: dict, colours: dict, out: list) -> list[str]:
    """Views of ``view``'s If/Loop/Scan bodies (nested ones too) appended to ``out``; their nodes run
    inside ``owner``, on its provider. Returns the keys of ``view``'s own bodies."""
    keys = []
    for attr in view.subgraphs:
        try:
            body = view.subgraphs[attr]
        except ValueError:  # a body the core cannot read is drawn as the node alone
            continue
        key = f"body:{path}/{attr}"
        keys.append(key)
        items: list[dict] = []
        producer: dict[str, str] = {}
        for v in list(body.inputs) + list(body.outer_inputs):
            outer = v not in body.inputs
            items.append({"id": f"{key}:in:{v}", "kind": "port" if outer else "input",
                          "label": ("outer " if outer else "") + v, "title": f"{'outer value' if outer else 'input'} "
                          f"{v}", "preds": []})
            producer[v] = items[-1]["id"]
        nested: list = []
        for nv in body.nodes:
            it = {"id": nv.name, "kind": "subnode", "label": nv.op_type, "provider": owner["provider"],
                  "partition": owner["partition"], "fill": owner["fill"], "declined": False,
                  "title": f"{nv.name} ({nv.domain + '.' if nv.domain else ''}{nv.op_type})\nruns inside "
                           f"{owner['id']} on {owner['provider']}, partition {owner['partition']}",
                  "preds": [(producer[i], i) for i in list(nv.inputs) + list(nv.implicit_inputs) if i in producer]}
            items.append(it)
            for o in nv.outputs:
                if o:
                    producer[o] = nv.name
            if nv.subgraphs:
                nested.append((it, nv))
        for o in body.outputs:
            if o in producer:
                items.append({"id": f"{key}:out:{o}", "kind": "output", "label": o, "title": f"output {o}",
                              "preds": [(producer[o], o)]})
        out.append(_view(items, copies, key, f"{owner['id']}: {attr} ({len(body.nodes)} node(s), on "
                         f"{owner['provider']})", colours))
        for it, nv in nested:
            it["bodies"] = _body_views(it, nv, nv.name, copies, colours, out)
    return keys


def graph_view(session) -> dict:
    """The main view of ``session``'s partitioned graph (nodes as report entries with positions;
    repeated blocks collapsed into one item each) and ``views``: one per block and per
    If/Loop/Scan body, drawn when expanded."""
    report = session.get_partition_report()
    by_name = {v.name: v for v in session.get_graph_nodes()}  # same names as the report
    colours = partition_colours(report)
    copies = {c.value: c for c in report.copies}
    blocks: dict[str, tuple[str, str]] = {}  # node name -> (block key, description of its run)
    for r, (start, length, count) in enumerate(repeated_blocks([e.op_type for e in report.nodes])):
        # one op repeated is one item; else each repetition is one, or a few share one in a long run
        per = count if length == 1 else -(-count // MAX_RUN_ITEMS)
        for j in range(0, count, per):
            first = start + j * length
            n = min(per, count - j)
            what = (f"repetitions {j + 1}-{j + n}" if n > 1 else f"repetition {j + 1}") + \
                f" of {count} of a block of {length} node(s) (run {r + 1})"
            for e in report.nodes[first:first + n * length]:
                blocks[e.name] = (f"{r + 1}.{j // per + 1}", what)
    producer: dict[str, str] = {}
    items: list[dict] = []
    for v in session.get_inputs():
        items.append({"id": f"in:{v.name}", "kind": "input", "label": v.name, "title": f"input {v.name}: {v.type} "
                      f"{list(v.shape) if v.shape is not None else '?'}", "preds": []})
        producer[v.name] = f"in:{v.name}"
    extra_views: list[dict] = []
    for e in report.nodes:
        nv = by_name.get(e.name)
        ins = (list(nv.inputs) + list(nv.implicit_inputs)) if nv is not None else []
        title = [f"{e.name} ({e.domain + '.' if e.domain else ''}{e.op_type})",
                 f"{e.provider}, partition {e.partition}"]
        title += [f"declined by {p}: {r}" for p, r in e.declined.items()]
        it = {"id": e.name, "kind": "node", "label": e.op_type, "title": "\n".join(title),
              "provider": e.provider, "partition": e.partition, "fill": colours.get(e.partition, "#ccc"),
              "declined": bool(e.declined), "ins": [i for i in ins if i],
              "outs": [o for o in (nv.outputs if nv is not None else []) if o]}
        if nv is not None and nv.subgraphs:
            it["bodies"] = _body_views(it, nv, e.name, copies, colours, extra_views)
        items.append(it)
    outputs = session.get_outputs()
    # main view: the nodes of one block are one item, placed where its last node is
    last: dict[str, int] = {}
    for i, it in enumerate(items):
        if it["id"] in blocks:
            last[blocks[it["id"]][0]] = i
    main: list[dict] = []
    members: dict[str, list[dict]] = {}
    for it in items:
        b = blocks.get(it["id"])
        if b is not None:
            members.setdefault(b[0], []).append(it)
    for i, it in enumerate(items):
        b = blocks.get(it["id"])
        if b is None:
            main.append(it)
        elif last[b[0]] == i:
            mem = members[b[0]]
            counts: dict[int, int] = {}
            for m in mem:
                counts[m["partition"]] = counts.get(m["partition"], 0) + 1
            part = max(counts, key=counts.get)
            provs: dict[str, int] = {}
            for m in mem:
                provs[m["provider"]] = provs.get(m["provider"], 0) + 1
            g = {"id": f"block:{b[0]}", "kind": "block", "label": f"block {b[0]} ({len(mem)})",
                 "title": f"{b[1]}, from {mem[0]['id']} to {mem[-1]['id']} ("
                          + ", ".join(f"{p}: {c}" for p, c in provs.items()) + "); click to expand",
                 "provider": mem[0]["provider"] if len(provs) == 1 else None, "partition": part,
                 "fill": colours.get(part, "#ccc"), "parts": counts, "members": len(mem)}
            main.append(g)
    where = {it["id"]: (f"block:{blocks[it['id']][0]}" if it["id"] in blocks else it["id"])
             for it in items if it["kind"] == "node"}
    for it in items:
        if it["kind"] == "node":
            for o in it["outs"]:
                producer[o] = it["id"]
    for it in main:
        if it["kind"] == "node":
            it["preds"] = [(where[producer[i]] if producer[i] in where else producer[i], i)
                           for i in it["ins"] if i in producer]
        elif it["kind"] == "block":
            mem = members[it["id"][len("block:"):]]
            inside = {m["id"] for m in mem}
            it["preds"] = [(where.get(producer[i], producer[i]), i) for m in mem for i in m["ins"]
                           if i in producer and producer[i] not in inside]
    for v in outputs:
        if v.name in producer:
            main.append({"id": f"out:{v.name}", "kind": "output", "label": v.name,
                         "title": f"output {v.name}: {v.type}",
                         "preds": [(where.get(producer[v.name], producer[v.name]), v.name)]})
    views = []
    byid = {it["id"]: it for it in items}
    for key, mem in members.items():
        inside = {m["id"] for m in mem}
        sub: list[dict] = []
        ports: dict[str, str] = {}
        for m in mem:
            for i in m["ins"]:
                if i in producer and producer[i] not in inside and i not in ports:
                    src = byid.get(producer[i])
                    ports[i] = f"{key}:in:{i}"
                    sub.append({"id": ports[i], "kind": "port", "label": i, "title": f"from outside the block: {i}",
                                "provider": src.get("provider") if src else None, "preds": []})
        consumed_outside = {i for it in items if it["id"] not in inside for i in it.get("ins", [])}
        consumed_outside |= {v.name for v in outputs}
        for m in mem:
            m["preds"] = [(producer[i] if producer[i] in inside else ports[i], i) for i in m["ins"]
                          if i in producer]
            sub.append(m)
        for m in mem:
            for o in m["outs"]:
                if o in consumed_outside:
                    sub.append({"id": f"{key}:out:{o}", "kind": "output", "label": o,
                                "title": f"to outside the block: {o}", "preds": [(m["id"], o)]})
        views.append(_view(sub, copies, f"block:{key}", f"block {key}: {len(mem)} node(s), {mem[0]['id']} to "
                           f"{mem[-1]['id']}", colours))
    view = _view(main, copies, "main", "", colours, report)
    view["views"] = views + extra_views
    return view


def render_svg(view: dict, model: str) -> str:
    """The graph as one ``<svg>``: ``g.node`` elements carry ``data-name``, ``data-provider`` and
    ``data-partition``; copy edges are ``path.copy`` with a ``<title>``."""
    e = html.escape
    place = {it["id"]: it for it in view["items"]}
    out = [f'<svg class="graph" data-view="{e(view["key"])}" data-model="{e(model)}" xmlns="http://www.w3.org/2000/svg" '
           f'data-width="{view["width"]}" data-height="{view["height"]}">'
           '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" markerHeight="6" '
           'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#888"/></marker></defs><g class="viewport">']
    for ed in view["edges"]:
        s, d = place[ed["src"]], place[ed["dst"]]
        x1, y1 = s["x"] + NODE_W, s["y"] + NODE_H / 2
        x2, y2 = d["x"], d["y"] + NODE_H / 2
        if x2 > x1:
            c1 = c2 = (x1 + x2) / 2
        else:  # to a later row of the wrapped drawing
            c1, c2 = x1 + GAP_X, x2 - GAP_X
        cls = "edge copy" if ed["copy"] else "edge"
        out.append(f'<path class="{cls}" d="M{x1:g},{y1:g} C{c1:g},{y1:g} {c2:g},{y2:g} {x2:g},{y2:g}" '
                   f'marker-end="url(#arrow)"><title>{e(ed["title"])}</title></path>')
    for it in view["items"]:
        label = it["label"] if len(it["label"]) <= 20 else it["label"][:19] + "\u2026"
        tail = ""
        if it["kind"] in ("node", "subnode"):
            extra = (f' data-provider="{e(it["provider"])}" data-partition="{it["partition"]}"'
                     f' data-declined="{"1" if it["declined"] else "0"}"')
            if it.get("bodies"):  # If/Loop/Scan: a click opens the bodies' drawings
                extra += f' data-views="{e(" ".join(it["bodies"]))}"'
                tail = f'<text class="badge" x="{NODE_W - 9}" y="{NODE_H / 2 + 4:g}">\u25b8</text>'
            dec = ' class="declined"' if it["declined"] else ""
            shape = f'<rect width="{NODE_W}" height="{NODE_H}" rx="4" fill="{it["fill"]}"{dec}/>'
        elif it["kind"] == "block":
            extra = (f' data-views="{e(it["id"])}" data-partition="{it["partition"]}" data-members="{it["members"]}"'
                     + (f' data-provider="{e(it["provider"])}"' if it["provider"] else ""))
            shape = f'<rect class="blockbox" width="{NODE_W}" height="{NODE_H}" rx="4" fill="{it["fill"]}"/>'
            x, total = 0.0, sum(it["parts"].values())
            for part, n in sorted(it["parts"].items()):  # each partition's share of the block's nodes
                w = NODE_W * n / total
                shape += (f'<rect class="share" data-partition="{part}" x="{x:g}" y="{NODE_H - 5}" width="{w:g}" '
                          f'height="5" fill="{view["colours"].get(part, "#ccc")}"/>')
                x += w
            tail = f'<text class="badge" x="{NODE_W - 9}" y="{NODE_H / 2 + 4:g}">\u25b8</text>'
        else:
            extra = f' data-provider="{e(it["provider"])}"' if it.get("provider") else ""
            dash = ' stroke-dasharray="3 2"' if it["kind"] == "port" else ""
            shape = f'<rect width="{NODE_W}" height="{NODE_H}" rx="{NODE_H // 2}" fill="#f4f4f4"{dash}/>'
        out.append(f'<g class="{it["kind"]}" data-name="{e(it["id"])}"{extra} transform="translate({it["x"]},{it["y"]})">'
                   f'<title>{e(it["title"])}</title>{shape}'
                   f'<text x="{NODE_W / 2:g}" y="{NODE_H / 2 + 4:g}">{e(label)}</text>{tail}</g>')
    out.append("</g></svg>")
    return "".join(out)


def _legend(view: dict) -> str:
    e = html.escape
    rep = view["report"]
    rows = []
    for p in rep.partitions:
        rows.append(f'<span class="swatch" data-partition="{p["id"]}" data-provider="{e(p["provider"])}" '
                    f'data-fill="{view["colours"][p["id"]]}"><i style="background:{view["colours"][p["id"]]}"></i>'
                    f'partition {p["id"]}: {e(p["provider"])} ({p["nodes"]} node(s))</span>')
    copies = len(rep.copies)
    rows.append(f'<span class="swatch"><i class="copyline"></i>device copy ({copies})</span>')
    rows.append('<span class="swatch"><i class="declinedbox"></i>declined by a higher-priority provider</span>')
    return '<div class="legend">' + "".join(rows) + "</div>"


def _section(name: str, session, interactive: bool, extra: str = "") -> str:
    e = html.escape
    view = graph_view(session)
    rep = view["report"]
    inputs = [{"name": i.name, "type": i.type, "shape": [d if isinstance(d, int) else None for d in (i.shape or [])]}
              for i in session.get_inputs()]
    summary = e(rep.summary()).replace("\n", "<br>")
    form = ""
    if interactive:
        fields = "".join(
            f'<div class="inp" data-input="{e(i["name"])}"><b>{e(i["name"])}</b> {e(i["type"])} shape '
            f'<input class="shape" value="{e(",".join(str(d) if d is not None else "1" for d in i["shape"]))}" '
            f'size="14"> <textarea class="data" rows="1" placeholder="data as JSON (empty: random)"></textarea> '
            f'or <input type="file" class="file" accept=".npy"></div>'
            for i in inputs)
        form = (f'<form class="run" data-model="{e(name)}">{fields}<button type="submit">Run</button> '
                '<span class="latency"></span><pre class="result"></pre></form>')
    return (f'<section class="model" id="model-{e(name)}" data-model="{e(name)}"><h2>{e(name)}</h2>'
            f'<div class="summary">{summary}{extra}</div>{_legend(view)}'
            '<div class="tools"><button class="fit">fit</button><button class="zin">+</button>'
            '<button class="zout">&minus;</button><input class="find" placeholder="find node by name or op">'
            f'<span class="found"></span></div><div class="canvas">{render_svg(view, name)}</div>{_drills(view, name)}'
            f'<script type="application/json" class="inputs">{_json_for_script(inputs)}</script>{form}</section>')


def _drills(view: dict, name: str) -> str:
    """The drawings of the repeated blocks and If/Loop/Scan bodies, hidden until their item is clicked
    (or a search finds a node inside)."""
    e = html.escape
    return '<div class="drills">' + "".join(
        f'<div class="drill" data-view="{e(v["key"])}" hidden><div class="drillhead"><b>{e(v["title"])}</b> '
        f'<button class="close">close</button></div><div class="canvas small">{render_svg(v, name)}</div></div>'
        for v in view["views"]) + "</div>"


def _json_for_script(value) -> str:
    return json.dumps(value).replace("</", "<\\/")


_CSS = """
body{font:14px system-ui,sans-serif;margin:0;padding:0 1.2em;color:#222}
h1{font-size:1.4em} h2{margin-bottom:.2em}
nav a{margin-right:1em}
.summary{color:#444;font-size:.9em;margin-bottom:.4em}
.legend{display:flex;flex-wrap:wrap;gap:.4em 1.2em;margin:.4em 0}
.swatch i{display:inline-block;width:1.1em;height:.9em;margin-right:.3em;vertical-align:middle;border:1px solid #555}
.swatch i.copyline{border:none;border-top:3px dashed #d0021b;height:0}
.swatch i.declinedbox{border:2px dashed #333}
.canvas{height:62vh;border:1px solid #bbb;overflow:hidden;background:#fff;cursor:grab}
.canvas.small{height:45vh}.drill{margin:.4em 0;border-left:4px solid #888;padding-left:.5em}.drillhead{font-size:.9em;margin:.2em 0}
svg .block,svg [data-views]{cursor:pointer}svg .block rect.blockbox{stroke:#333;stroke-width:3;stroke-dasharray:none}svg text.badge{font-weight:bold}
svg.graph{width:100%;height:100%;user-select:none}
svg text{font-size:12px;text-anchor:middle;fill:#111;pointer-events:none}
svg .node rect,svg .subnode rect{stroke:#333;stroke-width:1}
svg .node rect.declined{stroke-dasharray:4 2;stroke-width:2}
svg .input rect,svg .output rect,svg .port rect{stroke:#777}
svg .edge{fill:none;stroke:#999;stroke-width:1.2}
svg .edge.copy{stroke:#d0021b;stroke-width:3;stroke-dasharray:6 3}
svg .hit rect{stroke:#ff0;stroke-width:4}
.tools{margin:.3em 0}.tools input{width:18em}
form.run{margin:.6em 0 2em}.inp{margin:.2em 0}.inp textarea{vertical-align:middle;width:24em}
pre.result{background:#f6f6f6;padding:.5em;max-height:20em;overflow:auto}
"""

_JS = r"""
(function(){
function panzoom(canvas){
  const svg=canvas.querySelector('svg.graph'), vp=svg.querySelector('g.viewport');
  const W=+svg.dataset.width||1, H=+svg.dataset.height||1, pz={s:1,tx:0,ty:0,moved:false};
  function apply(){vp.setAttribute('transform','translate('+pz.tx+','+pz.ty+') scale('+pz.s+')');}
  pz.fit=function(){const r=svg.getBoundingClientRect();if(!r.width)return;
    pz.s=Math.min(r.width/(W+20),r.height/(H+20),1.5);pz.tx=(r.width-W*pz.s)/2;pz.ty=(r.height-H*pz.s)/2;apply();};
  pz.zoomAt=function(f,cx,cy){pz.tx=cx-(cx-pz.tx)*f;pz.ty=cy-(cy-pz.ty)*f;pz.s*=f;apply();};
  pz.zoomCentre=function(f){const r=svg.getBoundingClientRect();pz.zoomAt(f,r.width/2,r.height/2);};
  pz.focus=function(g){const t=g.transform.baseVal.consolidate().matrix, r=svg.getBoundingClientRect();
    pz.s=1.2;pz.tx=r.width/2-(t.e+75)*pz.s;pz.ty=r.height/2-(t.f+15)*pz.s;apply();};
  svg.addEventListener('wheel',ev=>{ev.preventDefault();const r=svg.getBoundingClientRect();
    pz.zoomAt(ev.deltaY<0?1.2:1/1.2,ev.clientX-r.left,ev.clientY-r.top);},{passive:false});
  let drag=null;
  svg.addEventListener('mousedown',ev=>{drag=[ev.clientX,ev.clientY,pz.tx,pz.ty];pz.moved=false;});
  window.addEventListener('mousemove',ev=>{if(drag){const dx=ev.clientX-drag[0],dy=ev.clientY-drag[1];
    if(Math.abs(dx)+Math.abs(dy)>3)pz.moved=true;pz.tx=drag[2]+dx;pz.ty=drag[3]+dy;apply();}});
  window.addEventListener('mouseup',()=>{drag=null;});
  canvas._pz=pz;return pz;}
function setup(sec){
  const main=panzoom(sec.querySelector(':scope > .canvas')), svg=sec.querySelector(':scope > .canvas svg.graph');
  const fit=main.fit;
  sec.querySelectorAll('.drill .canvas').forEach(panzoom);
  function drillOf(key){return [...sec.querySelectorAll('.drill')].find(d=>d.dataset.view===key);}
  function open(key){const d=drillOf(key);if(!d)return null;const was=d.hidden;d.hidden=false;
    if(was)d.querySelector('.canvas')._pz.fit();return d;}
  sec.addEventListener('click',ev=>{const c=ev.target.closest('.canvas');if(c&&c._pz.moved)return;
    const close=ev.target.closest('.drill .close');if(close){close.closest('.drill').hidden=true;return;}
    const g=ev.target.closest('g[data-views]');if(!g)return;
    let first=null;for(const k of g.dataset.views.split(' ')){const d=open(k);first=first||d;}
    if(first)first.scrollIntoView({block:'nearest'});});
  sec.querySelector('.fit').onclick=fit;
  sec.querySelector('.zin').onclick=()=>main.zoomCentre(1.5);
  sec.querySelector('.zout').onclick=()=>main.zoomCentre(1/1.5);
  const find=sec.querySelector('.find'), found=sec.querySelector('.found');
  find.addEventListener('keydown',ev=>{if(ev.key!=='Enter')return;ev.preventDefault();
    sec.querySelectorAll('.hit').forEach(g=>g.classList.remove('hit'));
    const q=find.value.toLowerCase();if(!q)return;
    const hits=[...sec.querySelectorAll('g.node,g.subnode,g.input,g.output,g.block')].filter(g=>
      g.dataset.name.toLowerCase().includes(q)||g.querySelector('text').textContent.toLowerCase().includes(q));
    hits.forEach(g=>g.classList.add('hit'));found.textContent=hits.length+' match(es)';
    if(!hits.length)return;
    const h=hits[0], d=h.closest('.drill');
    if(d){open(d.dataset.view);d.scrollIntoView({block:'nearest'});
      const blk=svg.querySelector('g.block[data-views="'+CSS.escape(d.dataset.view)+'"]');
      if(blk){blk.classList.add('hit');main.focus(blk);}
      d.querySelector('.canvas')._pz.focus(h);}
    else main.focus(h);});
  fit(); sec._fit=fit;
  const form=sec.querySelector('form.run'); if(!form)return;
  const specs=JSON.parse(sec.querySelector('script.inputs').textContent);
  const DT={'tensor(float)':'FP32','tensor(double)':'FP64','tensor(float16)':'FP16','tensor(int64)':'INT64',
    'tensor(int32)':'INT32','tensor(int16)':'INT16','tensor(int8)':'INT8','tensor(uint8)':'UINT8',
    'tensor(uint16)':'UINT16','tensor(uint32)':'UINT32','tensor(uint64)':'UINT64','tensor(bool)':'BOOL',
    'tensor(string)':'BYTES'};
  function rnd(dt,n){const a=new Array(n);for(let i=0;i<n;i++){
    if(dt==='BOOL')a[i]=Math.random()<.5;else if(dt==='BYTES')a[i]='abc'[i%3];
    else if(dt.startsWith('FP')){let u=0,v=0;while(!u)u=Math.random();v=Math.random();a[i]=Math.sqrt(-2*Math.log(u))*Math.cos(2*Math.PI*v);}
    else a[i]=Math.floor(Math.random()*2);}return a;}
  const NPY={'<f4':'FP32','<f8':'FP64','<f2':'FP16','<i8':'INT64','<i4':'INT32','<i2':'INT16','|i1':'INT8',
    '|u1':'UINT8','<u2':'UINT16','<u4':'UINT32','<u8':'UINT64','|b1':'BOOL'};
  function npy(buf,name){const u=new Uint8Array(buf);
    if(u.length<10||String.fromCharCode(...u.slice(1,6))!=='NUMPY')throw new Error(name+' is not a .npy file');
    const v1=u[6]===1, hl=v1?u[8]|u[9]<<8:new DataView(buf).getUint32(8,true), off=(v1?10:12)+hl;
    const h=new TextDecoder().decode(u.slice(v1?10:12,off));
    const descr=(h.match(/'descr':\s*'([^']+)'/)||[])[1], dt=NPY[descr];
    if(!dt)throw new Error(name+': dtype '+descr+' cannot be sent (little-endian numbers or bool only)');
    if(/'fortran_order':\s*True/.test(h))throw new Error(name+': save it in C order');
    const shape=((h.match(/'shape':\s*\(([^)]*)\)/)||[])[1]||'').split(',').filter(x=>x.trim()).map(x=>parseInt(x,10));
    return {datatype:dt,shape:shape,bytes:u.slice(off)};}
  form.addEventListener('submit',async ev=>{ev.preventDefault();
    const out=form.querySelector('.result'), lat=form.querySelector('.latency');
    try{
      const inputs=[], chunks=[];
      for(const sp of specs){const row=form.querySelector('[data-input="'+CSS.escape(sp.name)+'"]');
        const dt=DT[sp.type]||sp.type, file=row.querySelector('.file').files[0];
        if(file){const a=npy(await file.arrayBuffer(), file.name);  // an uploaded .npy travels as binary data
          inputs.push({name:sp.name,datatype:a.datatype,shape:a.shape,parameters:{binary_data_size:a.bytes.byteLength}});
          chunks.push(a.bytes);continue;}
        const shape=row.querySelector('.shape').value.split(',').filter(x=>x.trim()!=='').map(x=>parseInt(x,10));
        const n=shape.reduce((a,b)=>a*b,1), txt=row.querySelector('.data').value.trim();
        inputs.push({name:sp.name,datatype:dt,shape:shape,data:txt?JSON.parse(txt):rnd(dt,n)});}
      const head=new TextEncoder().encode(JSON.stringify({inputs:inputs}));
      const headers={'Content-Type':chunks.length?'application/octet-stream':'application/json'};
      if(chunks.length)headers['Inference-Header-Content-Length']=String(head.byteLength);
      const t0=performance.now();
      const r=await fetch('v2/models/'+encodeURIComponent(form.dataset.model)+'/infer',{method:'POST',
        headers:headers,body:new Blob([head,...chunks])});
      const ms=performance.now()-t0, body=await r.json();
      if(!r.ok){lat.textContent='HTTP '+r.status;out.textContent=body.error;return;}
      lat.textContent='latency '+ms.toFixed(1)+' ms (server queue '+(r.headers.get('X-Queue-Ms')||'?')+' ms)';
      out.textContent=body.outputs.map(o=>{const d=o.data||[];let lo=Infinity,hi=-Infinity;
        for(const x of d)if(typeof x==='number'){if(x<lo)lo=x;if(x>hi)hi=x;}
        const st=lo<=hi?' min '+lo.toPrecision(4)+' max '+hi.toPrecision(4):'';
        return o.name+' '+o.datatype+' ['+o.shape.join(',')+']'+st+'\n  '+JSON.stringify(d.slice(0,8))+(d.length>8?' ...':'');}).join('\n');
    }catch(e){lat.textContent='error';out.textContent=String(e);}
  });
}
document.querySelectorAll('section.model').forEach(setup);
window.addEventListener('resize',()=>document.querySelectorAll('section.model').forEach(s=>s._fit&&s._fit()));
})();
"""


def _document(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<style>{_CSS}</style></head><body>{body}<script>{_JS}</script></body></html>')


def render_page(models) -> str:
    """The server's page: each served model's picture and run form (``models``: ServedModels)."""
    from .._version import __version__

    nav = "".join(f'<a href="#model-{html.escape(m.name)}">{html.escape(m.name)}</a>' for m in models)
    sections = []
    for m in models:
        batch = (f"<br>dynamic batching: up to {m.cfg.max_batch_size} rows, {m.cfg.max_queue_delay_ms:g} ms delay"
                 if m.batching else "")
        sections.append(_section(m.name, m.session, True, batch))
    body = (f"<h1>runtime-core {html.escape(__version__)}: {len(models)} model(s)</h1><nav>{nav}</nav>"
            "<p>Open Inference Protocol v2 at <code>/v2</code>, metrics at <a href='metrics'>/metrics</a>. "
            "Wheel zooms, drag pans; hover a node for its provider and decline reasons.</p>" + "".join(sections))
    return _document("runtime-core serve", body)


def write_partition_html(session, name: str, path: str) -> None:
    """``runtime-core partition MODEL --html OUT``: the picture alone, as one offline file."""
    body = f"<h1>{html.escape(name)}: partition</h1>" + _section(name, session, False)
    Path(path).write_text(_document(f"{name}: partition", body), encoding="utf-8")
