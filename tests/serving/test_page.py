"""The page at ``/`` and ``runtime-core partition --html``: checked as HTML, and in a real headless
Chromium (Debian's chromium and chromium-driver, driven by Selenium; no browser download):
every node drawn with its report's provider and partition colour, copies and decline reasons
shown, a 1200-node graph reachable by search, the run form answering; a screenshot is kept."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import runtime_core as rt
from runtime_core.cli import main
from runtime_core.serving import BackgroundServer, ModelConfig, ServerConfig
from runtime_core.serving.model import ServedModel
from runtime_core.serving.page import partition_colours

import serve_models as models

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
OPENCL = "OpenCLExecutionProvider" in rt.get_available_providers()


@pytest.fixture(scope="module")
def transformer(tmp_path_factory) -> Path:
    """A BERT-style encoder exported from PyTorch (TorchScript exporter, opset 17)."""
    pytest.importorskip("torch")
    from models.builders import export_torch

    path = tmp_path_factory.mktemp("page") / "bert.onnx"
    path.write_bytes(export_torch("bert", "torchscript", 17).model)
    return path


def _providers():
    # with the OpenCL provider (PoCL on the CPU) the encoder splits into several partitions with copies
    return ["opencl", "cpu"] if OPENCL else None


def test_partition_html_offline(transformer, tmp_path, capsys):
    out = tmp_path / "bert.html"
    argv = ["partition", str(transformer), "--html", str(out)] + (["--providers", "opencl,cpu"] if OPENCL else [])
    assert main(argv) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    page = out.read_text()
    rep = rt.InferenceSession(str(transformer), providers=_providers()).get_partition_report()
    colours = partition_colours(rep)
    nodes = re.findall(r'<g class="node" data-name="([^"]*)" data-provider="([^"]*)" data-partition="(\d+)"'
                       r'[^>]*><title>[^<]*</title><rect [^>]*fill="(#[0-9a-f]{6})"', page)
    assert len(nodes) == len(rep.nodes)
    want = {n.name: (n.provider, n.partition) for n in rep.nodes}
    for name, prov, part, fill in nodes:
        assert want[name] == (prov, int(part)) and fill == colours[int(part)]
    assert page.count('class="edge copy"') == sum(1 for _ in re.finditer(r'class="edge copy"', page))
    assert "<script src" not in page and "<link" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")  # self-contained
    assert "<form" not in page  # offline: no server to run on


def test_partition_html_refuses_a_bad_path(transformer, tmp_path, capsys):
    assert main(["partition", str(transformer), "--html", str(tmp_path / "no" / "x.html")]) == 2
    assert "--html" in capsys.readouterr().err


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        if os.environ.get("RUNTIME_CORE_BROWSER_REQUIRED") == "1":
            pytest.fail("RUNTIME_CORE_BROWSER_REQUIRED=1 but chromium/chromedriver are not installed")
        pytest.skip("no system chromium + chromedriver (Debian: apt-get install chromium chromium-driver)")
    pytest.importorskip("selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager look for a browser online
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def served(model_dir, transformer, tmp_path_factory):
    wide = models.wide(tmp_path_factory.mktemp("wide") / "wide.onnx")
    ms = [ServedModel(ModelConfig(str(transformer), name="bert", providers=_providers())),
          ServedModel(ModelConfig(str(model_dir / "cnn.onnx"), max_batch_size=4)),
          ServedModel(ModelConfig(wide))]
    with BackgroundServer(ServerConfig(models=[]), models=ms) as s:
        yield s, {m.name: m for m in ms}


def _wait(driver, script, limit=30):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        v = driver.execute_script(script)
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for: {script}")


def test_page_in_chromium(browser, served, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    server, ms = served
    browser.get(server.url + "/")
    _wait(browser, "return document.querySelectorAll('section.model').length === 3")
    for name, m in ms.items():
        rep = m.session.get_partition_report()
        drawn = browser.execute_script("""
            return [...document.querySelectorAll('section[data-model="' + arguments[0] + '"] g.node')].map(g =>
              [g.dataset.name, g.dataset.provider, +g.dataset.partition,
               getComputedStyle(g.querySelector('rect')).fill, g.querySelector('title').textContent,
               (g.querySelector(':scope > text') || {}).textContent]);""", name)
        assert len(drawn) == len(rep.nodes), name
        legend = browser.execute_script("""
            const out = {}; document.querySelectorAll('section[data-model="' + arguments[0] + '"] .swatch[data-partition]')
              .forEach(s => { out[s.dataset.partition] = [s.dataset.provider,
                              getComputedStyle(s.querySelector('i')).backgroundColor]; }); return out;""", name)
        want = {n.name: n for n in rep.nodes}
        for node_name, prov, part, fill, title, label in drawn:
            n = want[node_name]
            assert label == (n.op_type if len(n.op_type) <= 20 else n.op_type[:19] + "\u2026")  # drawn, on top
            assert (prov, part) == (n.provider, n.partition)
            assert legend[str(part)] == [n.provider, fill]  # the node's colour is its partition's legend colour
            for who, why in n.declined.items():
                assert f"declined by {who}: {why}" in title
        fills = {}
        for _, prov, part, fill, _, _ in drawn:
            fills.setdefault(fill, set()).add(part)
        assert all(len(parts) == 1 for parts in fills.values())  # one colour, one partition
        copies = browser.execute_script("""return [...document.querySelectorAll(
            'section[data-model="' + arguments[0] + '"] path.edge.copy title')].map(t => t.textContent);""", name)
        crossing = {c.value for c in rep.copies}
        assert all(t.split(":")[0].removeprefix("copy of ") in crossing for t in copies)
        if name == "bert" and OPENCL:
            assert len(rep.partitions) > 1 and copies  # the OpenCL/CPU split is visible

    # the 1200-node graph: every node there (its 400 repeated blocks collapsed into fewer items), and a
    # search brings the last one into view
    sec = browser.find_element(By.CSS_SELECTOR, 'section[data-model="wide"]')
    assert len(sec.find_elements(By.CSS_SELECTOR, "g.node")) == len(ms["wide"].session.get_partition_report().nodes)
    assert len(sec.find_elements(By.CSS_SELECTOR, "g.node")) >= 1000
    browser.execute_script("arguments[0].scrollIntoView()", sec)
    find = sec.find_element(By.CSS_SELECTOR, "input.find")
    find.send_keys("add399", Keys.ENTER)
    _wait(browser, "return document.querySelector('section[data-model=\"wide\"] .found').textContent.length > 0")
    inside = browser.execute_script("""
        const sec = document.querySelector('section[data-model="wide"]');
        const hit = sec.querySelector('g.hit[data-name="add399"]');  // in its repeated block's drawing, opened
        const c = hit.closest('.canvas').getBoundingClientRect(), g = hit.getBoundingClientRect();
        return g.width > 20 && g.left >= c.left && g.right <= c.right && g.top >= c.top && g.bottom <= c.bottom;""")
    assert inside
    before = browser.execute_script("return document.querySelector('section[data-model=\"wide\"] g.viewport')"
                                    ".getAttribute('transform')")
    sec.find_element(By.CSS_SELECTOR, "button.zout").click()
    assert browser.execute_script("return document.querySelector('section[data-model=\"wide\"] g.viewport')"
                                  ".getAttribute('transform')") != before

    # the run form: random inputs, outputs and latency shown
    sec = browser.find_element(By.CSS_SELECTOR, 'section[data-model="cnn"]')
    browser.execute_script("arguments[0].scrollIntoView()", sec)
    sec.find_element(By.CSS_SELECTOR, "form.run button[type=submit]").click()
    _wait(browser, "return document.querySelector('section[data-model=\"cnn\"] .latency').textContent"
                   ".startsWith('latency')")
    result = sec.find_element(By.CSS_SELECTOR, "pre.result").text
    assert "probs FP32 [1,10]" in result and "logits FP32 [1,10]" in result
    # given inputs: the page's output equals the session's
    x = np.linspace(-1, 1, 768, dtype=np.float32).reshape(1, 3, 16, 16)
    area = sec.find_element(By.CSS_SELECTOR, "textarea.data")
    browser.execute_script("arguments[0].value = arguments[1]", area, str(x.reshape(-1).tolist()))
    browser.execute_script("arguments[0].querySelector('.latency').textContent = ''", sec)
    sec.find_element(By.CSS_SELECTOR, "form.run button[type=submit]").click()
    _wait(browser, "return document.querySelector('section[data-model=\"cnn\"] .latency').textContent"
                   ".startsWith('latency')")
    shown = sec.find_element(By.CSS_SELECTOR, "pre.result").text.splitlines()
    first = np.array(eval(shown[1].strip().removesuffix(" ...")), np.float32)  # the first 8 values of probs
    np.testing.assert_allclose(first, ms["cnn"].session.run(["probs"], {"x": x})[0].reshape(-1)[:8], rtol=1e-6)

    # an uploaded .npy (sent as binary tensor data): its own shape, the session's answer
    x2 = np.random.default_rng(5).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x2)
    browser.execute_script("arguments[0].value = ''; arguments[1].querySelector('.latency').textContent = ''",
                           area, sec)
    sec.find_element(By.CSS_SELECTOR, "input.file").send_keys(str(tmp_path / "x.npy"))
    sec.find_element(By.CSS_SELECTOR, "form.run button[type=submit]").click()
    _wait(browser, "return document.querySelector('section[data-model=\"cnn\"] .latency').textContent"
                   ".startsWith('latency')")
    shown = sec.find_element(By.CSS_SELECTOR, "pre.result").text.splitlines()
    assert shown[0].startswith("probs FP32 [2,10]")
    first = np.array(eval(shown[1].strip().removesuffix(" ...")), np.float32)
    np.testing.assert_allclose(first, ms["cnn"].session.run(["probs"], {"x": x2})[0].reshape(-1)[:8], rtol=1e-6)

    # a picture of the partition, kept as the test's artifact
    browser.execute_script("window.scrollTo(0, 0)")
    shot = tmp_path / "serve_page.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    print(f"\nscreenshot: {shot}")


# -- repeated blocks and control-flow bodies ----------------------------------------------------------

@pytest.fixture(scope="module")
def bert12(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    return Path(models.bert_layers(tmp_path_factory.mktemp("bert12") / "bert12.onnx"))


def _every_node_once(view, rep):
    """Each report node is drawn exactly once: in the main view or in its block's view."""
    drawn = [it["id"] for v in [view, *view["views"]] for it in v["items"] if it["kind"] == "node"]
    assert sorted(drawn) == sorted(n.name for n in rep.nodes)


def _bert12_session(bert12, optimize: bool):
    so = rt.SessionOptions()
    if not optimize:  # the export as written: about 950 nodes
        so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    return rt.InferenceSession(str(bert12), so, providers=_providers())


def test_repeated_blocks_collapse(bert12):
    from runtime_core.serving.page import graph_view, repeated_blocks

    assert repeated_blocks(list("xy" + "ABC" * 4 + "z")) == [(2, 3, 4)]
    assert repeated_blocks(list("xy" + "ABC" * 3 + "z")) == []  # 9 nodes: too few to collapse
    assert repeated_blocks(list("AB" * 8 + "CDE" * 5)) == [(0, 2, 8), (16, 3, 5)]
    assert repeated_blocks(list("I" * 12 + "Q")) == [(0, 1, 12)]
    for optimize in (True, False):
        sess = _bert12_session(bert12, optimize)
        rep = sess.get_partition_report()
        view = graph_view(sess)
        _every_node_once(view, rep)
        blocks = [it for it in view["items"] if it["kind"] == "block"]
        runs: dict[str, list] = {}
        for b in blocks:  # ids are block:RUN.ITEM
            runs.setdefault(b["id"].split(":")[1].split(".")[0], []).append(b["members"])
        # the 12 encoder layers, one item each
        assert any(len(m) == 12 and len(set(m)) == 1 and m[0] >= 7 for m in runs.values()), runs
        if not optimize:
            assert len(rep.nodes) >= 900 and len(view["items"]) < len(rep.nodes) / 10  # the main picture is small


def test_control_flow_bodies_drawn(tmp_path):
    from runtime_core.serving.page import graph_view

    sess = rt.InferenceSession(models.control_flow(tmp_path / "cf.onnx"))
    rep = sess.get_partition_report()
    view = graph_view(sess)
    _every_node_once(view, rep)
    prov = {n.name: (n.provider, n.partition) for n in rep.nodes}
    bodies = {v["key"]: v for v in view["views"] if v["key"].startswith("body:")}
    assert set(bodies) == {"body:branch/then_branch", "body:branch/else_branch", "body:repeat/body",
                           "body:repeat/body/b_if/then_branch", "body:repeat/body/b_if/else_branch"}
    want_ops = {"body:branch/then_branch": ["Mul", "Sin"], "body:branch/else_branch": ["Neg"],
                "body:repeat/body": ["Identity", "If"], "body:repeat/body/b_if/then_branch": ["Add"],
                "body:repeat/body/b_if/else_branch": ["Sub"]}
    for key, v in bodies.items():
        nodes = [it for it in v["items"] if it["kind"] == "subnode"]
        assert [it["label"] for it in nodes] == want_ops[key]
        owner = key.split(":")[1].split("/")[0]  # the main-graph node whose provider runs the body
        assert all((it["provider"], it["partition"]) == prov[owner] for it in nodes)
    main = {it["id"]: it for it in view["items"]}
    assert sorted(main["branch"]["bodies"]) == ["body:branch/else_branch", "body:branch/then_branch"]
    assert main["repeat"]["bodies"] == ["body:repeat/body"]
    b_if = next(it for it in bodies["body:repeat/body"]["items"] if it["label"] == "If")
    assert sorted(b_if["bodies"]) == ["body:repeat/body/b_if/else_branch", "body:repeat/body/b_if/then_branch"]


def test_blocks_and_bodies_in_chromium(browser, bert12, tmp_path):
    """The offline page of a 12-layer export: every report node reachable by expanding its block,
    drawn in its partition's colour; If/Loop bodies open from their node."""
    from runtime_core.serving.page import write_partition_html

    sess = _bert12_session(bert12, optimize=False)
    rep = sess.get_partition_report()
    assert len(rep.nodes) >= 900
    out = tmp_path / "bert12.html"
    write_partition_html(sess, "bert12", str(out))
    browser.get(out.as_uri())
    _wait(browser, "return document.querySelectorAll('svg.graph g.block').length >= 12")
    legend = browser.execute_script("""const o = {}; document.querySelectorAll('.swatch[data-partition]').forEach(s =>
        { o[s.dataset.partition] = getComputedStyle(s.querySelector('i')).backgroundColor; }); return o;""")
    want = {n.name: n for n in rep.nodes}
    seen = set()
    # the main picture: the nodes outside the blocks, each in its partition's colour
    top = browser.execute_script("""return [...document.querySelectorAll('section > .canvas g.node')].map(g =>
        [g.dataset.name, +g.dataset.partition, getComputedStyle(g.querySelector('rect')).fill]);""")
    for name, part, fill in top:
        assert want[name].partition == part and legend[str(part)] == fill
        seen.add(name)
    n_blocks = browser.execute_script("return document.querySelectorAll('section > .canvas g.block').length")
    for k in range(n_blocks):
        # click block k: its drawing opens, and each of its nodes lies inside the visible canvas
        res = browser.execute_script("""
            const blk = document.querySelectorAll('section > .canvas g.block')[arguments[0]];
            blk.querySelector('rect').dispatchEvent(new MouseEvent('click', {bubbles: true}));
            const d = [...document.querySelectorAll('.drill')].find(x => x.dataset.view === blk.dataset.views);
            const c = d.querySelector('.canvas').getBoundingClientRect();
            const share = [...blk.querySelectorAll('rect.share')].map(r => [+r.dataset.partition,
                              getComputedStyle(r).fill]);
            const nodes = [...d.querySelectorAll('g.node')].map(g => { const r = g.getBoundingClientRect();
              return [g.dataset.name, +g.dataset.partition, getComputedStyle(g.querySelector('rect')).fill,
                      r.width > 0 && r.left >= c.left - 1 && r.right <= c.right + 1 && r.top >= c.top - 1
                      && r.bottom <= c.bottom + 1]; });
            return [d.hidden, +blk.dataset.members, nodes, share];""", k)
        hidden, members, nodes, share = res
        assert not hidden and members == len(nodes)
        for name, part, fill, visible in nodes:
            assert visible, name
            assert want[name].partition == part and legend[str(part)] == fill
            seen.add(name)
        assert all(legend[str(p)] == f for p, f in share)
    assert seen == set(want)  # every node of the export reached
    # search finds a node inside a block: its drawing opens and shows it
    from runtime_core.serving.page import graph_view

    names = [n.name for n in rep.nodes]
    last_block = [v for v in graph_view(sess)["views"] if v["key"].startswith("block:")][-1]
    last = next(it["id"] for it in reversed(last_block["items"])  # a name no other name contains
                if it["kind"] == "node" and sum(it["id"].lower() in n.lower() for n in names) == 1)
    browser.execute_script("document.querySelectorAll('.drill').forEach(d => d.hidden = true)")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.find_element(By.CSS_SELECTOR, "input.find").send_keys(last, Keys.ENTER)
    ok = _wait(browser, """const g = [...document.querySelectorAll('.drill g.node.hit')].find(x =>
        x.dataset.name === arguments[0]); if (!g || g.closest('.drill').hidden) return false;
        const c = g.closest('.canvas').getBoundingClientRect(), r = g.getBoundingClientRect();
        return r.left >= c.left && r.right <= c.right && r.top >= c.top && r.bottom <= c.bottom;""".replace(
        "arguments[0]", repr(last)))
    assert ok

    # control flow: the If node opens both branches, the Loop its body, and the body's If its own
    cf = rt.InferenceSession(models.control_flow(tmp_path / "cf.onnx"))
    write_partition_html(cf, "cf", str(tmp_path / "cf.html"))
    browser.get((tmp_path / "cf.html").as_uri())
    _wait(browser, "return document.querySelectorAll('g.node').length === 4")
    prov = {n.name: n.provider for n in cf.get_partition_report().nodes}
    opened = browser.execute_script("""
        const click = g => g.querySelector('rect').dispatchEvent(new MouseEvent('click', {bubbles: true}));
        const open = () => [...document.querySelectorAll('.drill')].filter(d => !d.hidden).map(d => d.dataset.view);
        click(document.querySelector('g.node[data-name="branch"]')); const a = open();
        click(document.querySelector('g.node[data-name="repeat"]'));
        click(document.querySelector('g.subnode[data-name="repeat/body/b_if"]')); const b = open();
        const sub = [...document.querySelectorAll('.drill:not([hidden]) g.subnode')].map(g => [g.dataset.name,
          g.dataset.provider, g.getBoundingClientRect().width > 0]);
        return [a, b, sub];""")
    a, b, sub = opened
    assert sorted(a) == ["body:branch/else_branch", "body:branch/then_branch"]
    assert set(b) == {*a, "body:repeat/body", "body:repeat/body/b_if/then_branch", "body:repeat/body/b_if/else_branch"}
    assert len(sub) == 7 and all(vis for _, _, vis in sub)
    assert all(p == prov[name.split("/")[0]] for name, p, _ in sub)
    browser.save_screenshot(str(tmp_path / "blocks.png"))
