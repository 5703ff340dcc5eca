"""The benchmark corpus (benchmarks/corpus): its fixed tune/report split, the export variants it
covers, and three of its cheapest builders at the tiny size, each loaded in onnxruntime and in
runtime-core with matching outputs (``nox -s corpus_check`` checks every builder)."""

from pathlib import Path

import pytest

from runtime_core.bench_protocol import load_corpus

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(str(ROOT / "benchmarks" / "corpus"))


def test_split_is_by_family_position_and_disjoint(corpus):
    tune, report = corpus.select("tune"), corpus.select("report")
    assert len(corpus.ENTRIES) >= 20 and tune and report
    assert not set(tune) & set(report) and set(tune) | set(report) == set(corpus.select("all"))
    for name in corpus.select("all"):
        e = corpus.ENTRIES[name]
        assert e.half == ("tune" if corpus.FAMILIES.index(e.family) % 2 == 0 else "report"), name
    families = {corpus.ENTRIES[n].family for n in corpus.ENTRIES}
    assert families == set(corpus.FAMILIES)  # every family has models; none is unplaced
    with pytest.raises(ValueError, match="half must be"):
        corpus.select("both")


def test_corpus_covers_the_export_variants_users_produce(corpus):
    kw = [e.kwargs for e in corpus.ENTRIES.values()]
    torch_kw = [k for k in kw if "exporter" in k]
    assert {k["exporter"] for k in torch_kw} == {"torchscript", "dynamo"}
    assert {k["opset"] for k in torch_kw} == set(range(14, 21))
    assert {k["dynamic"] for k in torch_kw} == {True, False}
    assert {k["batch"] for k in torch_kw} >= {1, 8} and {k["seq"] for k in torch_kw if "seq" in k} >= {128, 384}
    assert {k.get("attention") for k in torch_kw} >= {"sdpa"}  # and the tril-buffer default
    for f in ("bert", "distilbert", "gpt2", "vit", "t5_encoder", "whisper_encoder", "albert_shared", "resnet50",
              "mobilenet_v3", "efficientnet_b0", "convnext_tiny", "lstm", "gru", "random_forest", "lightgbm",
              "xgboost"):
        assert f in corpus.FAMILIES


@pytest.mark.parametrize("name", ["distilbert_ts16_dyn_b1_s384", "convnext_tiny_ts17_b1",
                                  "lstm_bi2x256_ts15_dyn_b1_s384"])
def test_tiny_builder_loads_and_matches_onnxruntime(corpus, tmp_path, name):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    import importlib

    check = importlib.import_module(f"{corpus.__name__}.check")
    assert check.check_one(name, tmp_path, "tiny") == ""
    model = tmp_path / "tiny" / f"{name}.onnx"
    mtime = model.stat().st_mtime_ns
    corpus.build(name, tmp_path, "tiny")
    assert model.stat().st_mtime_ns == mtime  # taken from the cache, not rebuilt


def test_unknown_corpus_model_is_named(corpus, tmp_path):
    with pytest.raises(KeyError, match="unknown corpus model 'nope'; known: bert_base"):
        corpus.build("nope", tmp_path)
