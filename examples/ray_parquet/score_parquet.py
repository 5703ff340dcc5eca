"""Parquet of features -> Parquet of predictions with Ray Data, timed against one in-process session.

    python examples/ray_parquet/score_parquet.py --rows 400000 --out /tmp/ray_parquet

Builds a LightGBM classifier as users train them (300 boosting rounds of 31-leaf trees on 20
features, 3 classes: 900 trees; onnxmltools converter, ZipMap output) and a Parquet file of its
features, then scores the file two ways and prints rows/s for each and their ratio:
  - one in-process session, 1 intra-op thread, reading and writing Parquet with pyarrow;
  - Ray Data on a local cluster (actors + 1 logical CPUs, the extra one for the read/write
    tasks): read_parquet (blocks of about one batch) -> map_batches(Predictor, batch_format="numpy", concurrency=2 actors with
    1 CPU and 1 intra-op thread each) -> write_parquet (the actors' start-up is inside the timing);
checks that both wrote the same predictions, and says where the actors' time went (inside the
Predictor: scoring; the rest: Ray, Arrow conversions, start-up, waiting for a core).
Needs `pip install 'runtime-core[ray]' lightgbm onnxmltools`.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FEATURES = 20


def make(out: str, rows: int, trees: int) -> tuple[str, str]:
    import lightgbm as lgb
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    rng = np.random.default_rng(0)
    x = rng.normal(size=(20_000, FEATURES)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int) + (x[:, 3] > 1)
    clf = lgb.LGBMClassifier(n_estimators=trees, num_leaves=31, verbose=-1).fit(x, y)
    onx = convert_lightgbm(clf, initial_types=[("input", FloatTensorType([None, FEATURES]))], target_opset=15)
    model = os.path.join(out, "model.onnx")
    with open(model, "wb") as f:
        f.write(onx.SerializeToString())
    feats = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    table = pa.table({"id": np.arange(rows), **{f"f{i}": feats[:, i] for i in range(FEATURES)}})
    data = os.path.join(out, "features.parquet")
    pq.write_table(table, data, row_group_size=25_000)
    return model, data


def in_process(model: str, data: str, out: str, batch: int) -> float:
    """One session with one intra-op thread, the same Predictor code without Ray."""
    from runtime_core.integrations.ray import Predictor

    t = time.perf_counter()
    pred = Predictor(model, sess_options={"intra_op_num_threads": 1}, id_column="id", keep_columns=["id"],
                     publish_report=False)
    parts = []
    for rb in pq.ParquetFile(data).iter_batches(batch_size=batch):
        cols = {name: rb.column(i).to_numpy() for i, name in enumerate(rb.schema.names)}
        parts.append(pa.table(pred(cols)))
    pq.write_table(pa.concat_tables(parts), out)
    return time.perf_counter() - t


def with_ray(model: str, data: str, out: str, batch: int, actors: int) -> float:
    import ray

    from runtime_core.integrations.ray import Predictor, partition_reports

    log_dir = os.path.join(out + "_calls")
    os.makedirs(log_dir, exist_ok=True)

    class TimedPredictor(Predictor):
        """The Predictor, logging when it was ready and each call's rows, wall and CPU seconds and
        end (wall clock), so the job's time splits into start-up, scoring and the rest."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._log = os.path.join(log_dir, f"{os.getpid()}.log")
            with open(self._log, "a") as f:
                f.write(f"0 0 0 {time.time():.3f}\n")

        def __call__(self, batch):
            t, c = time.perf_counter(), time.process_time()
            res = super().__call__(batch)
            with open(self._log, "a") as f:
                f.write(f"{len(batch['id'])} {time.perf_counter() - t:.4f} {time.process_time() - c:.4f} "
                        f"{time.time():.3f}\n")
            return res

    # one logical CPU beyond the actors' for the read/write tasks: with none left, they never run
    ray.init(num_cpus=actors + 1, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    # Ray gives a whole block to one actor: blocks of about one batch each let every actor work
    # (the default 128 MiB makes a file of up to ~1.5M rows here a single block: one busy actor)
    row_bytes = sum(f.type.byte_width for f in pq.read_schema(data))
    ctx.target_max_block_size = max(1 << 20, batch * row_bytes)
    try:
        t, t0 = time.perf_counter(), time.time()
        (ray.data.read_parquet(data)
         .map_batches(TimedPredictor, fn_constructor_kwargs={"model": model, "id_column": "id", "keep_columns": ["id"]},
                      concurrency=actors, num_cpus=1, batch_size=batch, batch_format="numpy")
         .write_parquet(out))
        took = time.perf_counter() - t
        threads = sorted(r["intra_op_num_threads"] for r in partition_reports().values())
        print(f"  actors' intra-op threads (from their 1 CPU each): {threads}", flush=True)
        for log in sorted(glob.glob(os.path.join(log_dir, "*.log"))):
            calls = np.loadtxt(log, ndmin=2)
            ready, calls = calls[0, 3] - t0, calls[1:]
            last = calls[-1, 3] - t0 if len(calls) else float("nan")
            print(f"  actor pid {os.path.basename(log)[:-4]}: ready at {ready:.1f} s, {len(calls)} batches, "
                  f"{int(calls[:, 0].sum()):,} rows, {calls[:, 1].sum():.1f} s inside the Predictor "
                  f"({calls[:, 2].sum():.1f} s CPU), last batch done at {last:.1f} s of {took:.1f} s", flush=True)
        return took
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--trees", type=int, default=300, help="boosting rounds (x3 classes trees)")
    ap.add_argument("--batch", type=int, default=25_000)
    ap.add_argument("--out", default="ray_parquet_out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model, data = make(args.out, args.rows, args.trees)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; {args.trees} rounds x 3 "
          f"classes, {args.rows:,} rows, batches of {args.batch:,}", flush=True)
    one = in_process(model, data, os.path.join(args.out, "predictions_in_process.parquet"), args.batch)
    print(f"in-process, 1 session x 1 thread: {args.rows / one:,.0f} rows/s ({one:.1f} s)", flush=True)
    ray_dir = os.path.join(args.out, "predictions_ray")
    for old in (ray_dir, ray_dir + "_calls"):  # a previous run's files would be read back too
        shutil.rmtree(old, ignore_errors=True)
    two = with_ray(model, data, ray_dir, args.batch, actors=2)
    print(f"Ray Data, 2 actors x 1 thread:    {args.rows / two:,.0f} rows/s ({two:.1f} s)")
    print(f"ratio Ray / in-process: {one / two:.2f}x (load average {os.getloadavg()[0]:.1f} at the end)")
    print("command: python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]))
    a = pq.read_table(os.path.join(args.out, "predictions_in_process.parquet")).to_pandas().sort_values("id")
    b = pq.read_table(ray_dir).to_pandas().sort_values("id")
    assert len(a) == len(b) == args.rows
    for c in a.columns:
        np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=1e-6)
    print(f"same {len(a):,} predictions, columns {list(a.columns)}")


if __name__ == "__main__":
    main()
