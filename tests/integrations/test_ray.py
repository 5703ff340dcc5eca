"""runtime_core.integrations.ray on a local Ray cluster this module starts (2 CPUs, loopback):
Ray Data scoring equals an in-process session, a killed actor loses no rows, Ray Serve answers
OIP v2 JSON over HTTP with the session's outputs; the Predictor's rules run in-process too."""

import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

try:
    import ray
except ImportError:
    if os.environ.get("RUNTIME_CORE_EXPECT_INSTALLED") == "1":
        raise
    pytest.skip("ray is not installed (extra runtime-core[ray])", allow_module_level=True)

import runtime_core as rt
from runtime_core.errors import InvalidArgumentError
from runtime_core.integrations.ray import (BatchRowShapeError, BatchRowTypeError, Predictor, _arrow_table,
                                           deployment, partition_reports)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="runtime-core-tests",
             _temp_dir=None)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    try:
        from ray import serve
        serve.shutdown()
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def lgb_model():
    import lightgbm as lgb
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(int) + (x[:, 2] > 1)
    clf = lgb.LGBMClassifier(n_estimators=12, num_leaves=8, verbose=-1).fit(x, y)
    onx = convert_lightgbm(clf, initial_types=[("input", FloatTensorType([None, 6]))], target_opset=15, zipmap=True)
    return onx.SerializeToString()


def _cnn(batch):
    """input [batch, 1, 16, 16] -> Conv(4, 3x3) -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax"""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.normal(size=(4, 1, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "b")
    g = numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "g")
    nodes = [helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "g"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 1, 16, 16])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 3])], [w, b, g])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m.SerializeToString()


@pytest.fixture(scope="module")
def cnn_model():
    return _cnn("N")


def _features(n, seed=2):
    import pandas as pd

    x = np.random.default_rng(seed).normal(size=(n, 6)).astype(np.float32)
    df = pd.DataFrame({f"f{i}": x[:, i] for i in range(6)})
    df.insert(0, "id", np.arange(n))
    return df, x


def _check_lgb(out, x, model):
    out = out.sort_values("id").reset_index(drop=True)
    assert list(out["id"]) == list(range(len(x)))  # every row once, none dropped
    label, probs = rt.InferenceSession(model).run(None, {"input": x})
    np.testing.assert_array_equal(out["label"].to_numpy(), label)
    for k in probs[0]:
        np.testing.assert_allclose(out[f"probabilities_{k}"].to_numpy(), [p[k] for p in probs], rtol=1e-6)


# -- Ray Data ------------------------------------------------------------------------------------
def test_lightgbm_100k_rows_parquet_to_parquet_through_ray_data(cluster, lgb_model, tmp_path, monkeypatch):
    """The example's (and docs/ray.md's) throughput set-up: one Parquet file read by 2 actors, the
    read fused into them (no batch_size, blocks of one row group, read units of 2 row groups), a few
    write tasks. Each actor reads and scores its own share; every row comes back once, scored as
    in-process. Half a CPU per actor: the list and write tasks need the cluster's other CPU."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    started = tmp_path / "started"
    started.mkdir()

    class Tagged(Predictor):  # a local class: pickled by value to the workers
        def __init__(self, **kw):
            super().__init__(**kw)
            (started / str(os.getpid())).touch()

        def __call__(self, batch):
            # no scoring before both actors exist, so that the first cannot take every read unit
            deadline = time.monotonic() + 120
            while len(os.listdir(started)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            out = super().__call__(batch)
            return out.append_column("pid", pa.array(np.full(out.num_rows, os.getpid())))

    df, x = _features(100_000)
    path = tmp_path / "features.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=10_000)
    row_bytes = 8 + 6 * 4
    ctx = ray.data.DataContext.get_current()
    monkeypatch.setattr(ctx, "target_max_block_size", 10_000 * row_bytes)  # one row group, one batch
    # read units of 2 row groups: Ray 2.60 packs row groups up to these bytes (in memory), Ray 2.58
    # cuts the file into byte ranges of the context's chunk size (on disk)
    monkeypatch.setenv("RAY_DATA_PARQUET_BIN_PACKING_BYTES", str(2 * 10_000 * row_bytes))
    if hasattr(ctx, "parquet_chunker_target_chunk_size"):
        monkeypatch.setattr(ctx, "parquet_chunker_target_chunk_size", os.path.getsize(path) // 5 + 1)
    ds = (ray.data.read_parquet(str(path), ray_remote_args={"num_cpus": 0.5})  # as the actors: else no fusion
          .map_batches(Tagged, fn_constructor_kwargs={"model": lgb_model, "id_column": "id", "output_format": "pyarrow"},
                       compute=ray.data.ActorPoolStrategy(size=2, max_tasks_in_flight_per_actor=1),
                       num_cpus=0.5, batch_size=None, batch_format="numpy"))
    ds.write_parquet(str(tmp_path / "out"), min_rows_per_file=25_000)
    assert re.search(r"Read\w*->MapBatches\(Tagged\)", ds.stats()), ds.stats()  # read in the actors
    out = pq.read_table(tmp_path / "out").to_pandas()
    assert len(set(out["pid"])) == 2, out["pid"].value_counts()  # each actor read and scored a share
    assert len(out) == 100_000 and out["id"].is_unique  # no row lost or doubled
    _check_lgb(out, x, lgb_model)
    reports = partition_reports()
    mine = {k: r for k, r in reports.items() if r["pid"] in set(out["pid"])}
    assert len(mine) == 2, reports  # each actor published its own report
    want = Predictor(lgb_model, publish_report=False).report["report"]
    for r in mine.values():  # threads sized from the actor's CPU share, not the node's 2
        assert r["intra_op_num_threads"] == 1, r
        assert all(n["provider"] == "CPUExecutionProvider" for n in r["report"]["nodes"])
        assert r["report"] == want
    # published to the cluster's key-value store: no registry actor (one more process per job)
    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    assert not any("runtime_core" in n for n in names), names


def test_usage_stats_stay_off(cluster):
    """No telemetry: a Ray Data job starts no usage-collecting actor, and workers see Ray's usage
    stats off."""
    assert ray.data.range(10).map_batches(lambda b: b).count() == 10
    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    assert "DataUsageCollectionActor" not in names, names

    @ray.remote(num_cpus=0)
    def enabled():
        try:
            from ray._common.usage import usage_lib
        except ImportError:  # Ray before the module moved
            from ray._private.usage import usage_lib
        return usage_lib.usage_stats_enabled()

    assert ray.get(enabled.remote()) is False


@pytest.mark.parametrize("preset", [None, "1"])
def test_importing_the_module_turns_usage_stats_off_unless_asked(preset):
    """A driver that joins a running cluster (ray.init(address=...)) does not get the switch-off that
    ray.init's own local cluster makes: importing the module does it, an explicit 1 is kept."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RAY_USAGE_STATS_ENABLED"}
    if preset:
        env["RAY_USAGE_STATS_ENABLED"] = preset
    code = ("import runtime_core.integrations.ray\n"
            "try:\n    from ray._common.usage import usage_lib\n"
            "except ImportError:\n    from ray._private.usage import usage_lib\n"
            "print(usage_lib.usage_stats_enabled())")  # what Ray Data's usage collection asks too
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("True" if preset == "1" else "False")


def test_an_in_process_predictor_never_imports_ray(lgb_model, tmp_path):
    """Outside a Ray cluster the Predictor (its default publish_report=True and thread sizing
    included) scores without importing Ray (~0.3 CPU s), and keeps its report on itself."""
    import subprocess
    import sys

    model = tmp_path / "m.onnx"
    model.write_bytes(lgb_model)
    code = ("import sys\nimport numpy as np\nfrom runtime_core.integrations.ray import Predictor\n"
            f"p = Predictor({str(model)!r})\n"
            "out = p({'input': np.zeros((3, 6), np.float32)})\n"
            "print(sorted(out), p.report['pid'] > 0, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("]")[1].split() == ["True", "False"], out.stdout
    assert "'label'" in out.stdout and "'probabilities_0'" in out.stdout, out.stdout


def test_cnn_2000_images_through_ray_data(cluster, cnn_model):
    images = np.random.default_rng(3).random((2000, 1, 16, 16), dtype=np.float32)
    ds = ray.data.from_numpy(images)  # one tensor column, "data"
    out = ds.map_batches(Predictor, fn_constructor_kwargs={"model": cnn_model, "input_columns": {"input": "data"},
                                                           "keep_columns": False},
                         concurrency=2, batch_size=250, num_cpus=1).take_all()
    # row order is kept within blocks; compare as a set of (image checksum -> probs) via the input
    got = np.stack([r["probs"] for r in out])
    assert got.shape == (2000, 3)
    want = rt.InferenceSession(cnn_model).run(None, {"input": images})[0]
    np.testing.assert_allclose(np.sort(got, axis=0), np.sort(want, axis=0), rtol=1e-5, atol=1e-6)
    ordered = ds.map_batches(Predictor, fn_constructor_kwargs={"model": cnn_model, "input_columns": {"input": "data"}},
                             concurrency=1, batch_size=250, num_cpus=1).take(300)
    for r in ordered[:300:37]:  # each row's output belongs to its own image
        np.testing.assert_allclose(r["probs"], rt.InferenceSession(cnn_model).run(None, {"input": r["data"][None]})[0][0],
                                   rtol=1e-5, atol=1e-6)


def test_an_actor_killed_mid_job_loses_no_rows(cluster, lgb_model, tmp_path):
    marker = str(tmp_path / "died")

    class DiesOnce(Predictor):  # a local class: pickled by value to the workers
        def __call__(self, batch):
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return super().__call__(batch)
            os._exit(1)  # the first batch any actor sees kills that actor's process

    df, x = _features(6000, seed=4)
    ds = ray.data.from_pandas([df.iloc[i:i + 1000] for i in range(0, 6000, 1000)])
    out = ds.map_batches(DiesOnce, fn_constructor_kwargs={"model": lgb_model, "id_column": "id"},
                         concurrency=2, batch_size=500, num_cpus=1, batch_format="pandas",
                         max_restarts=-1, max_task_retries=-1).to_pandas()
    assert os.path.exists(marker), "no actor died: the test did not test anything"
    _check_lgb(out, x, lgb_model)
    incarnations: dict[str, int] = {}
    for key in partition_reports():  # "actor id:worker id"
        incarnations[key.split(":")[0]] = incarnations.get(key.split(":")[0], 0) + 1
    assert max(incarnations.values()) >= 2, incarnations  # the restarted actor published again


# -- Ray Serve -----------------------------------------------------------------------------------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_serve_answers_oip_v2_http_with_the_sessions_outputs(cluster, lgb_model):
    from ray import serve

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # a long wait: on a busy machine 8 concurrent requests may reach the replica 100s of ms apart
    serve.run(deployment(lgb_model, name="lgb", max_batch_size=4, batch_wait_timeout_s=1.0,
                         ray_actor_options={"num_cpus": 1}), name="lgb", route_prefix="/")
    url = f"http://127.0.0.1:{port}/v2/models/lgb/infer"
    rng = np.random.default_rng(5)
    xs = [rng.normal(size=(k, 6)).astype(np.float32) for k in (1, 3, 2, 5, 1, 4, 2, 3)]
    bodies = [{"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
              for x in xs]
    bodies[2]["outputs"] = [{"name": "label"}]
    start = threading.Barrier(len(bodies))

    def post_together(body):
        start.wait()
        return _post(url, body)

    with ThreadPoolExecutor(len(bodies)) as pool:  # concurrent requests, so @serve.batch groups them
        answers = list(pool.map(post_together, bodies))
    sizes = {int(k): v for k, v in serve.get_app_handle("lgb").batch_sizes.remote().result().items()}
    assert sum(k * v for k, v in sizes.items()) == len(bodies), sizes  # every request ran, once
    assert max(sizes) > 1 and max(sizes) <= 4, sizes  # batched, never beyond max_batch_size
    sess = rt.InferenceSession(lgb_model)
    for x, body, (status, ans) in zip(xs, bodies, answers):
        assert status == 200, ans
        assert ans["model_name"] == "lgb"
        label, probs = sess.run(None, {"input": x})
        outs = {o["name"]: o for o in ans["outputs"]}
        assert outs["label"]["datatype"] == "INT64" and outs["label"]["shape"] == [len(x)]
        np.testing.assert_array_equal(outs["label"]["data"], label)
        if "outputs" in body:
            assert list(outs) == ["label"]
            continue
        p = outs["probabilities"]
        keys = p["parameters"]["classes"]
        np.testing.assert_allclose(np.reshape(p["data"], p["shape"]), [[m[k] for k in keys] for m in probs], rtol=1e-6)
    status, ans = _post(url, {"inputs": [{"name": "inptu", "shape": [1, 6], "datatype": "FP32", "data": [0] * 6}]})
    assert status == 400 and "'input'" in ans["error"], ans
    status, ans = _post(url, {"inputs": [{"name": "input", "shape": [1, 5], "datatype": "FP32", "data": [0] * 5}]})
    assert status == 400 and "InputShapeError" in ans["error"], ans
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/lgb", timeout=60) as r:
        meta = json.loads(r.read())
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 6]}]
    serve.delete("lgb")


# -- the Predictor's rules, in-process -----------------------------------------------------------
def test_fixed_batch_dim_is_split_and_padded(cnn_model):
    images = np.random.default_rng(6).random((21, 1, 16, 16), dtype=np.float32)
    p = Predictor(_cnn(8), publish_report=False)
    out = p({"input": images})
    want = rt.InferenceSession(cnn_model).run(None, {"input": images})[0]
    assert out["probs"].shape == (21, 3)
    np.testing.assert_allclose(out["probs"], want, rtol=1e-5, atol=1e-6)


def test_bad_rows_raise_a_typed_error_naming_them(cnn_model):
    rows = [np.zeros((1, 16, 16), np.float32) for _ in range(6)]
    rows[3] = np.zeros((1, 15, 16), np.float32)
    rows[4] = np.zeros((1, 15, 16), np.float32)
    col = np.empty(6, dtype=object)
    col[:] = rows
    p = Predictor(cnn_model, id_column="key", publish_report=False)
    with pytest.raises(BatchRowShapeError, match=r"rows 3-4 \(key \[13, 14\]\)") as e:
        p({"input": col, "key": np.arange(10, 16)})
    assert e.value.rows == [3, 4] and isinstance(e.value, rt.capi.onnxruntime_pybind11_state.InvalidArgument)


def test_bad_rows_go_to_the_error_column_when_asked(lgb_model):
    df, x = _features(8, seed=7)
    data = {c: df[c].to_numpy() for c in df.columns}
    f2 = data["f2"].astype(object)
    f2[5] = "n/a"
    data["f2"] = f2
    with pytest.raises(BatchRowTypeError, match="rows 5"):
        Predictor(lgb_model, id_column="id", publish_report=False)(dict(data))
    out = Predictor(lgb_model, id_column="id", on_error="column", zipmap="array", publish_report=False)(dict(data))
    assert list(out["id"]) == list(range(8))
    assert [bool(e) for e in out["error"]] == [i == 5 for i in range(8)] and "'f2'" in out["error"][5]
    good = [i for i in range(8) if i != 5]
    label, probs = rt.InferenceSession(lgb_model).run(None, {"input": x[good]})
    np.testing.assert_array_equal(out["label"][good].astype(np.int64), label)
    assert out["label"][5] is None and np.isnan(out["probabilities"][5]).all()
    np.testing.assert_allclose(out["probabilities"][good], [list(m.values()) for m in probs], rtol=1e-6)


def test_pyarrow_output_holds_the_numpy_outputs_without_copies(cnn_model, lgb_model):
    """output_format="pyarrow": the same columns as the dict of numpy (labels, ZipMap columns or an
    [N, K] tensor column, an error column), numeric columns sharing the session's buffers, and Ray
    makes the same block of it as of the dict."""
    from ray.data.block import BlockAccessor

    df, x = _features(300, seed=5)
    data = {c: df[c].to_numpy() for c in df.columns}
    for kw in ({}, {"zipmap": "array", "keep_columns": False}):
        want = Predictor(lgb_model, id_column="id", publish_report=False, **kw)(dict(data))
        got = Predictor(lgb_model, id_column="id", publish_report=False, output_format="pyarrow", **kw)(dict(data))
        assert got.column_names == list(want)
        assert BlockAccessor.batch_to_block(got).equals(BlockAccessor.batch_to_block(want))
        same = _arrow_table(want)  # the conversion the Predictor makes, on these very arrays
        for name, col in want.items():
            np.testing.assert_array_equal(got.column(name).chunk(0).to_numpy(), col)
            if col.ndim == 1:  # zero-copy: the table's buffer is the numpy column's
                assert same.column(name).chunk(0).buffers()[1].address == col.ctypes.data, name
    _check_lgb(Predictor(lgb_model, id_column="id", publish_report=False, output_format="pyarrow")(dict(data))
               .to_pandas(), x, lgb_model)
    images = np.random.default_rng(4).random((5, 1, 16, 16), dtype=np.float32)
    got = Predictor(cnn_model, input_columns={"input": "data"}, output_format="pyarrow",
                    publish_report=False)({"data": images})
    np.testing.assert_allclose(got.column("probs").chunk(0).to_numpy(),
                               rt.InferenceSession(cnn_model).run(None, {"input": images})[0], rtol=1e-6)
    f2 = data["f2"].astype(object)
    f2[3] = "n/a"
    got = Predictor(lgb_model, id_column="id", on_error="column", output_format="pyarrow",
                    publish_report=False)({**data, "f2": f2})
    errors = got.column("error").to_pylist()
    assert [bool(e) for e in errors] == [i == 3 for i in range(300)] and got.column("label")[3].as_py() is None
    with pytest.raises(InvalidArgumentError, match="output_format"):
        Predictor(lgb_model, output_format="arrow", publish_report=False)


def test_pyarrow_batches_answer_as_pyarrow(cnn_model, lgb_model):
    """batch_format="pyarrow": the batch's columns reach the model as numpy (tensor columns too) and
    the answer is a pyarrow Table unless output_format says otherwise."""
    import pyarrow as pa
    from ray.data.block import BlockAccessor

    df, x = _features(200, seed=6)
    table = pa.Table.from_pandas(df, preserve_index=False)
    got = Predictor(lgb_model, id_column="id", publish_report=False)(table)
    assert isinstance(got, pa.Table)
    _check_lgb(got.to_pandas(), x, lgb_model)
    as_dict = Predictor(lgb_model, id_column="id", publish_report=False, output_format="numpy")(table)
    assert isinstance(as_dict, dict) and as_dict["f3"].dtype == np.float32
    images = np.random.default_rng(8).random((6, 1, 16, 16), dtype=np.float32)
    block = BlockAccessor.batch_to_block({"data": images})  # a tensor column, as Ray Data holds it
    got = Predictor(cnn_model, input_columns={"input": "data"}, keep_columns=False, publish_report=False)(block)
    np.testing.assert_allclose(got.column("probs").chunk(0).to_numpy(),
                               rt.InferenceSession(cnn_model).run(None, {"input": images})[0], rtol=1e-6)


def test_pandas_batches_and_a_missing_column(cnn_model, lgb_model):
    df, x = _features(10, seed=8)
    out = Predictor(lgb_model, feature_columns=[f"f{i}" for i in range(6)], keep_columns=["id"],
                    publish_report=False)(df)
    assert list(out.columns)[:2] == ["id", "label"]
    np.testing.assert_array_equal(out["label"].to_numpy(), rt.InferenceSession(lgb_model).run(["label"], {"input": x})[0])
    with pytest.raises(rt.errors.InputNameError, match="no column 'input'"):
        Predictor(cnn_model, publish_report=False)({"pixels": np.zeros((2, 1, 16, 16), np.float32)})


def test_a_device_provider_asks_ray_for_a_gpu():
    from runtime_core.integrations.ray import resources_for

    assert resources_for(["CUDAExecutionProvider", "cpu"]) == {"num_cpus": 1, "num_gpus": 1}
    assert resources_for([("cuda", {"device_id": 0})], num_cpus=2) == {"num_cpus": 2, "num_gpus": 1}
    assert resources_for(["cpu"]) == {"num_cpus": 1} and resources_for(None) == {"num_cpus": 1}


def test_zipmap_outputs_are_read_as_the_probability_tensor():
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(9)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    classes = ["cat", "dog", "emu"]
    y = np.array(classes)[(x[:, 0] > 0).astype(int) + (x[:, 1] > 1)]
    model = to_onnx(LogisticRegression().fit(x, y), x[:1], target_opset=15).SerializeToString()
    label, maps = rt.InferenceSession(model).run(None, {"X": x})  # the ZipMap's per-row dicts
    p = Predictor(model, publish_report=False)
    assert [n["op_type"] for n in p.report["report"]["nodes"] if n["op_type"] == "ZipMap"] == []
    out = p({"X": x})
    assert list(out["output_label"]) == list(label)
    for k in classes:
        np.testing.assert_allclose(out[f"output_probability_{k}"], [m[k] for m in maps], rtol=1e-6)
    arr = Predictor(model, zipmap="array", publish_report=False)({"X": x})["output_probability"]
    np.testing.assert_allclose(arr, [[m[k] for k in classes] for m in maps], rtol=1e-6)


def test_outputs_equal_an_in_process_sessions_labels_maps_regression_and_several_inputs(lgb_model):
    """The Predictor's columns -> feeds -> columns path against the session run on the same rows:
    a classifier's labels and probability maps, a regressor's [N, 1] output read from float64
    feature columns, and a model with three inputs of different types and ranks."""
    from skl2onnx import to_onnx
    from sklearn.tree import DecisionTreeRegressor

    df, x = _features(300, seed=10)
    batch = {c: df[c].to_numpy() for c in df.columns}
    label, maps = rt.InferenceSession(lgb_model).run(None, {"input": x})
    out = Predictor(lgb_model, id_column="id", keep_columns=["id"], publish_report=False)(batch)
    assert list(out) == ["id", "label"] + [f"probabilities_{k}" for k in sorted(maps[0])]
    np.testing.assert_array_equal(out["label"], label)
    for k in maps[0]:
        np.testing.assert_allclose(out[f"probabilities_{k}"], [m[k] for m in maps], rtol=1e-6)

    rng = np.random.default_rng(11)
    xr = rng.normal(size=(400, 5))
    reg = to_onnx(DecisionTreeRegressor(max_depth=6).fit(xr, xr[:, 0] * 2 + xr[:, 1] ** 2),
                  xr[:1].astype(np.float32), target_opset=15).SerializeToString()
    cols = {f"x{i}": xr[:, i] for i in range(5)}  # float64 columns: cast to the model's float32
    got = Predictor(reg, keep_columns=False, publish_report=False)(cols)
    (want,) = rt.InferenceSession(reg).run(None, {"X": xr.astype(np.float32)})
    assert list(got) == ["variable"] and got["variable"].shape == want.shape == (400, 1)
    np.testing.assert_array_equal(got["variable"], want)

    nodes = [helper.make_node("ReduceSum", ["a", "axes"], ["sa"], keepdims=0),
             helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["sa", "bf"], ["y"]),
             helper.make_node("Mul", ["c", "two"], ["z"])]
    graph = helper.make_graph(
        nodes, "three_inputs",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("b", TensorProto.INT64, ["N"]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, ["N", 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 2, 2])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes"), numpy_helper.from_array(np.float32(2), "two")])
    multi = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    a, b, c = rng.normal(size=(50, 3)), rng.integers(-5, 5, 50).astype(np.int32), rng.normal(size=(50, 2, 2))
    got = Predictor(multi, input_columns={"c": "image"}, keep_columns=["key"], publish_report=False)(
        {"key": np.arange(50), "a": a, "b": b, "image": c.astype(np.float32)})
    want = rt.InferenceSession(multi).run(None, {"a": a.astype(np.float32), "b": b.astype(np.int64),
                                                 "c": c.astype(np.float32)})
    assert list(got) == ["key", "y", "z"] and list(got["key"]) == list(range(50))
    np.testing.assert_array_equal(got["y"], want[0])
    np.testing.assert_array_equal(got["z"], want[1])


# -- the example's measuring tool -----------------------------------------------------------------
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the CPU accounting reads /proc (Linux)")
def test_the_examples_cpu_accounting_splits_a_child_process_by_window():
    """score_parquet.py's per-process CPU accounting, which the Ray section's before/after figures
    come from: a child that burns ~0.6 CPU s and then sleeps is counted whole over the run, and by
    wall-clock window its CPU lands in the window of the burn, none in the window of the sleep."""
    import importlib.util
    import subprocess
    import sys

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ray_parquet", "score_parquet.py")
    spec = importlib.util.spec_from_file_location("score_parquet", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    code = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6:\n    pass\n"
            "print(time.time(), flush=True)\ntime.sleep(3)\n")
    with mod._ProcessCPU() as cpu:
        t0 = time.time()
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        t1 = time.time()
        time.sleep(0.7)  # a sample after the child's end
    assert child.returncode == 0, child.stderr
    burnt = float(child.stdout)
    kind = "Ray's daemons: other"  # no "ray::" title and not one of Ray's named daemons
    assert 0.55 <= cpu.by_kind()[kind] <= 1.5, cpu.by_kind()  # the burn, the interpreter's start
    assert cpu.by_kind((t0, burnt + 2.0))[kind] >= 0.55
    assert cpu.by_kind((burnt + 2.0, t1)).get(kind, 0.0) < 0.1
    at, n = cpu.first_start()[kind]  # the child's start, from /proc (1/100 s ticks)
    assert n == 1 and t0 - 0.05 <= at <= burnt, (t0, at, burnt)
