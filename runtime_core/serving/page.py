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


def graph_view(session) -> dict:
    """Nodes (report entries with positions), edges and copies of ``session``'s partitioned graph."""
    report = session.get_partition_report()
    graph = session._graph  # the optimized graph the report describes (same node names)
    by_name = {n.name: n for n in graph.nodes}
    colours = partition_colours(report)
    copies = {c.value: c for c in report.copies}
    producer: dict[str, str] = {}
    items: list[dict] = []
    for v in session.get_inputs():
        items.append({"id": f"in:{v.name}", "kind": "input", "label": v.name, "title": f"input {v.name}: {v.type} "
                      f"{list(v.shape) if v.shape is not None else '?'}", "preds": []})
        producer[v.name] = f"in:{v.name}"
    for e in report.nodes:
        node = by_name.get(e.name)
        ins = node.all_inputs() if node is not None else []
        preds = [(producer[i], i) for i in ins if i in producer]
        title = [f"{e.name} ({e.domain + '.' if e.domain else ''}{e.op_type})",
                 f"{e.provider}, partition {e.partition}"]
        title += [f"declined by {p}: {r}" for p, r in e.declined.items()]
        items.append({"id": e.name, "kind": "node", "label": e.op_type, "title": "\n".join(title),
                      "provider": e.provider, "partition": e.partition, "fill": colours.get(e.partition, "#ccc"),
                      "declined": bool(e.declined), "preds": preds})
        for o in (node.outputs if node is not None else []):
            if o:
                producer[o] = e.name
    for v in session.get_outputs():
        if v.name in producer:
            items.append({"id": f"out:{v.name}", "kind": "output", "label": v.name,
                          "title": f"output {v.name}: {v.type}", "preds": [(producer[v.name], v.name)]})
    # longest-path layers, then each layer ordered by the mean position of its predecessors
    layer: dict[str, int] = {}
    for it in items:
        layer[it["id"]] = 1 + max((layer[p] for p, _ in it["preds"] if p in layer), default=-1)
    layers: dict[int, list[dict]] = {}
    for it in items:
        layers.setdefault(layer[it["id"]], []).append(it)
    pos: dict[str, float] = {}
    for k in sorted(layers):
        row = layers[k]
        for i, it in enumerate(row):
            ps = [pos[p] for p, _ in it["preds"] if p in pos]
            it["_key"] = (sum(ps) / len(ps)) if ps else i
        row.sort(key=lambda it: it["_key"])
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
    place = {it["id"]: it for it in items}
    edges = []
    for it in items:
        for p, value in it["preds"]:
            src = place[p]
            c = copies.get(value)
            is_copy = c is not None and src["kind"] != "input" and it.get("provider") is not None \
                and src.get("provider") != it.get("provider")
            edges.append({"src": p, "dst": it["id"], "value": value, "copy": is_copy,
                          "title": (f"copy of {value}: {c.src} -> {c.dst} "
                                    f"({'dynamic size' if c.bytes is None else str(c.bytes) + ' bytes'})")
                          if is_copy and c is not None else value})
    for it in items:
        it.pop("_key", None)
    width = min(depth, per_row) * (NODE_W + GAP_X)
    height = max(top - ROW_GAP, 0)
    return {"items": items, "edges": edges, "width": width, "height": height, "report": report,
            "colours": colours}


def render_svg(view: dict, model: str) -> str:
    """The graph as one ``<svg>``: ``g.node`` elements carry ``data-name``, ``data-provider`` and
    ``data-partition``; copy edges are ``path.copy`` with a ``<title>``."""
    e = html.escape
    place = {it["id"]: it for it in view["items"]}
    out = [f'<svg class="graph" data-model="{e(model)}" xmlns="http://www.w3.org/2000/svg" '
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
        if it["kind"] == "node":
            extra = (f' data-provider="{e(it["provider"])}" data-partition="{it["partition"]}"'
                     f' data-declined="{"1" if it["declined"] else "0"}"')
            dec = ' class="declined"' if it["declined"] else ""
            shape = f'<rect width="{NODE_W}" height="{NODE_H}" rx="4" fill="{it["fill"]}"{dec}/>'
        else:
            extra = ""
            shape = f'<rect width="{NODE_W}" height="{NODE_H}" rx="{NODE_H // 2}" fill="#f4f4f4"/>'
        out.append(f'<g class="{it["kind"]}" data-name="{e(it["id"])}"{extra} transform="translate({it["x"]},{it["y"]})">'
                   f'<title>{e(it["title"])}</title>{shape}'
                   f'<text x="{NODE_W / 2:g}" y="{NODE_H / 2 + 4:g}">{e(label)}</text></g>')
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
            f'<span class="found"></span></div><div class="canvas">{render_svg(view, name)}</div>'
            f'<script type="application/json" class="inputs">{_json_for_script(inputs)}</script>{form}</section>')


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
svg.graph{width:100%;height:100%;user-select:none}
svg text{font-size:12px;text-anchor:middle;fill:#111;pointer-events:none}
svg .node rect{stroke:#333;stroke-width:1}
svg .node rect.declined{stroke-dasharray:4 2;stroke-width:2}
svg .input rect,svg .output rect{stroke:#777}
svg .edge{fill:none;stroke:#999;stroke-width:1.2}
svg .edge.copy{stroke:#d0021b;stroke-width:3;stroke-dasharray:6 3}
svg .hit rect{stroke:#ff0;stroke-width:4}
.tools{margin:.3em 0}.tools input{width:18em}
form.run{margin:.6em 0 2em}.inp{margin:.2em 0}.inp textarea{vertical-align:middle;width:24em}
pre.result{background:#f6f6f6;padding:.5em;max-height:20em;overflow:auto}
"""

_JS = r"""
(function(){
function setup(sec){
  const svg=sec.querySelector('svg.graph'), vp=svg.querySelector('g.viewport');
  const W=+svg.dataset.width||1, H=+svg.dataset.height||1;
  let s=1,tx=0,ty=0;
  function apply(){vp.setAttribute('transform','translate('+tx+','+ty+') scale('+s+')');}
  function fit(){const r=svg.getBoundingClientRect();s=Math.min(r.width/(W+20),r.height/(H+20),1.5);
    tx=(r.width-W*s)/2;ty=(r.height-H*s)/2;apply();}
  function zoomAt(f,cx,cy){tx=cx-(cx-tx)*f;ty=cy-(cy-ty)*f;s*=f;apply();}
  svg.addEventListener('wheel',ev=>{ev.preventDefault();const r=svg.getBoundingClientRect();
    zoomAt(ev.deltaY<0?1.2:1/1.2,ev.clientX-r.left,ev.clientY-r.top);},{passive:false});
  let drag=null;
  svg.addEventListener('mousedown',ev=>{drag=[ev.clientX,ev.clientY,tx,ty];});
  window.addEventListener('mousemove',ev=>{if(drag){tx=drag[2]+ev.clientX-drag[0];ty=drag[3]+ev.clientY-drag[1];apply();}});
  window.addEventListener('mouseup',()=>{drag=null;});
  sec.querySelector('.fit').onclick=fit;
  sec.querySelector('.zin').onclick=()=>{const r=svg.getBoundingClientRect();zoomAt(1.5,r.width/2,r.height/2);};
  sec.querySelector('.zout').onclick=()=>{const r=svg.getBoundingClientRect();zoomAt(1/1.5,r.width/2,r.height/2);};
  const find=sec.querySelector('.find'), found=sec.querySelector('.found');
  find.addEventListener('keydown',ev=>{if(ev.key!=='Enter')return;ev.preventDefault();
    svg.querySelectorAll('.hit').forEach(g=>g.classList.remove('hit'));
    const q=find.value.toLowerCase();if(!q)return;
    const hits=[...svg.querySelectorAll('g.node,g.input,g.output')].filter(g=>
      g.dataset.name.toLowerCase().includes(q)||g.textContent.toLowerCase().includes(q));
    hits.forEach(g=>g.classList.add('hit'));found.textContent=hits.length+' match(es)';
    if(hits.length){const t=hits[0].transform.baseVal.consolidate().matrix, r=svg.getBoundingClientRect();
      s=1.2;tx=r.width/2-(t.e+75)*s;ty=r.height/2-(t.f+15)*s;apply();}});
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
