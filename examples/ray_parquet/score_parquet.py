"""Parquet of features -> Parquet of predictions with Ray Data, timed against one in-process session.

    python examples/ray_parquet/score_parquet.py --rows 1000000 --out /tmp/ray_parquet

Builds a LightGBM classifier as users train them (300 boosting rounds of 31-leaf trees on 20
features, 3 classes: 900 trees; onnxmltools converter, ZipMap output) and a Parquet file of its
features (both kept in --out and reused by the next run), then does the same job two ways:
  - one in-process session, 1 intra-op thread: read the Parquet file in batches with pyarrow,
    score, write the predictions to one Parquet file;
  - Ray Data on a local cluster started here (2 actors with 1 CPU and 1 intra-op thread each, one
    logical CPU more for the write tasks): read_parquet -> map_batches(Predictor) ->
    write_parquet, the read fused into the actors (see "Blocks, batches and throughput" in
    docs/ray.md);
checks that both wrote the same predictions, and prints rows/s end to end (Ray's start-up,
ray.init included, also shown apart), the two actors' steady rate once both score, the rows a
job needs for the end-to-end ratio to reach 1.6x at these rates, and, on Linux, the CPU seconds
each kind of Ray process spent. Needs `pip install 'runtime-core[ray]' lightgbm onnxmltools`.

With --address the Ray side runs as a job on a cluster that is already up instead (the way jobs
run on a cluster): its daemons, and the actors Ray Data keeps between jobs, are not started by
the job, and their CPU counts only from the job's start:

    ray start --head --num-cpus 3 --include-dashboard false --port 6379
    python examples/ray_parquet/score_parquet.py --rows 1000000 --address 127.0.0.1:6379
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FEATURES = 20


def make(out: str, rows: int, trees: int) -> tuple[str, str]:
    """The model and the features, each made only if --out does not hold it yet (training 900
    trees takes a minute)."""
    model = os.path.join(out, f"model_{trees}.onnx")
    data = os.path.join(out, f"features_{rows}.parquet")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20_000, FEATURES)).astype(np.float32)
    if not os.path.exists(model):
        import lightgbm as lgb
        from onnxmltools import convert_lightgbm
        from onnxmltools.convert.common.data_types import FloatTensorType

        y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int) + (x[:, 3] > 1)
        clf = lgb.LGBMClassifier(n_estimators=trees, num_leaves=31, verbose=-1).fit(x, y)
        onx = convert_lightgbm(clf, initial_types=[("input", FloatTensorType([None, FEATURES]))], target_opset=15)
        with open(model + ".tmp", "wb") as f:
            f.write(onx.SerializeToString())
        os.replace(model + ".tmp", model)
    if not os.path.exists(data):
        feats = rng.normal(size=(rows, FEATURES)).astype(np.float32)
        table = pa.table({"id": np.arange(rows), **{f"f{i}": feats[:, i] for i in range(FEATURES)}})
        pq.write_table(table, data + ".tmp", row_group_size=25_000)
        os.replace(data + ".tmp", data)
    return model, data


def in_process(model: str, data: str, out: str, batch: int) -> tuple[float, float]:
    """One session with one intra-op thread, the same Predictor code without Ray; returns the wall
    seconds and the CPU seconds spent inside the Predictor."""
    from runtime_core.integrations.ray import Predictor

    t = time.perf_counter()
    pred = Predictor(model, sess_options={"intra_op_num_threads": 1}, id_column="id", keep_columns=["id"])
    writer, in_pred = None, 0.0
    for rb in pq.ParquetFile(data).iter_batches(batch_size=batch):
        cols = {name: rb.column(i).to_numpy() for i, name in enumerate(rb.schema.names)}
        c = time.process_time()
        res = pred(cols)
        in_pred += time.process_time() - c
        table = pa.table(res)
        writer = writer or pq.ParquetWriter(out, table.schema)
        writer.write_table(table)
    writer.close()
    return time.perf_counter() - t, in_pred


class _ProcessCPU:
    """CPU seconds of this process and its descendants (Ray's daemons, workers and actors), and of
    the processes under ``roots`` (an already running cluster's raylet and GCS, added once known),
    read from /proc every half second so that processes which end early are counted too; a process
    that was running before counts only what it spent since. Linux only: elsewhere it records
    nothing."""

    def __init__(self):
        self.seen: dict[int, tuple[str, float]] = {}  # pid -> (most telling title, CPU seconds)
        self.started: dict[int, float] = {}  # pid -> when it started (wall clock, 1/100 s)
        self.series: dict[int, list[tuple[float, float]]] = {}  # pid -> [(wall clock, CPU seconds)]
        self.roots: set[int] = {os.getpid()}
        self._before: dict[int, float] = {os.getpid(): time.process_time()}  # the in-process job's among it
        self._t0 = 0  # now, in the clock ticks of /proc/PID/stat's start times
        self._boot = 0.0  # the wall clock at those ticks' zero
        if os.path.isdir("/proc/self"):
            with open("/proc/uptime") as f:
                up = float(f.read().split()[0])
            self._t0, self._boot = int(up * os.sysconf("SC_CLK_TCK")), time.time() - up
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        if os.path.isdir("/proc/self"):
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @staticmethod
    def _procs() -> dict[int, tuple[int, str, float, int]]:
        """pid -> (parent pid, command line, CPU seconds, start time in clock ticks since boot)"""
        tick, procs = os.sysconf("SC_CLK_TCK"), {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # ended meanwhile
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            procs[int(pid)] = (int(fields[1]), cmd, sum(int(x) for x in fields[11:13]) / tick, int(fields[19]))
        return procs

    def add_cluster(self, session_dir: str) -> None:
        """Count the running cluster of ``session_dir`` too: its daemons, and the workers under
        them, from now on."""
        for pid, (_, cmd, cpu, _) in self._procs().items():
            if session_dir in cmd:
                self.roots.add(pid)
                self._before.setdefault(pid, cpu)

    def _loop(self):
        while not self._stop.is_set():
            now, procs = time.time(), self._procs()
            for pid, (_, cmd, cpu, ticks) in procs.items():
                q = pid
                while q in procs and q not in self.roots and q != 1:
                    q = procs[q][0]
                if q not in self.roots:
                    continue
                if pid not in self.seen and pid not in self._before and not self._started_since(pid):
                    self._before[pid] = cpu  # an idle worker of the cluster, there before the job
                title = self.seen.get(pid, ("", 0.0))[0]
                if "ray::" in cmd and "IDLE" not in cmd or not title:  # a worker's title names its task
                    title = cmd
                self.seen[pid] = (title, cpu)
                self.started.setdefault(pid, self._boot + ticks / os.sysconf("SC_CLK_TCK"))
                self.series.setdefault(pid, []).append((now, cpu))
            self._stop.wait(0.5)

    def _started_since(self, pid: int) -> bool:
        """Whether ``pid`` started after this object was made."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[19]) >= self._t0
        except OSError:
            return True

    def _cpu_at(self, pid: int, t: float) -> float:
        """``pid``'s CPU seconds at wall clock ``t`` (its last sample before; its baseline if none)."""
        at = self._before.get(pid, 0.0)
        for when, cpu in self.series.get(pid, []):
            if when > t:
                break
            at = cpu
        return at

    @staticmethod
    def kind(pid: int, cmd: str) -> str:
        """What a process is, from its title or command line."""
        if pid == os.getpid():
            return "driver (this script: Ray Data's executor, ray.init)"
        if "ray::" in cmd:
            task = cmd.split()[0][5:]
            name = task.split(".")[0]
            return ("actors (Predictor)" if "MapWorker" in task else
                    "write tasks" if task.startswith("Write") else
                    "idle or other workers" if task.startswith("IDLE") else
                    f"Ray's {name}" if name in ("DashboardAgent", "RuntimeEnvAgent") else f"Ray Data's {name}")
        words = [os.path.basename(w) for w in cmd.split()[:4]]  # the program, or python [-u] script
        if "default_worker.py" in cmd:  # ended (or not yet titled) before a sample saw its task
            return "workers whose task no sample saw (short-lived: the footer reader, as a rule)"
        for name, what in (("gcs_server", "GCS"), ("raylet", "raylet"), ("dashboard.py", "dashboard head"),
                           ("log_monitor.py", "log monitor"), ("monitor.py", "autoscaler monitor")):
            if name in words:
                return f"Ray's daemons: {what}"
        return "Ray's daemons: other"

    def by_kind(self, window: tuple[float, float] | None = None) -> dict[str, float]:
        """CPU seconds per kind of process, over the whole run or (``window``, wall clock) within it."""
        kinds: dict[str, float] = {}
        for pid, (cmd, cpu) in self.seen.items():
            kind = self.kind(pid, cmd)
            spent = (cpu - self._before.get(pid, 0.0) if window is None
                     else self._cpu_at(pid, window[1]) - self._cpu_at(pid, window[0]))
            kinds[kind] = kinds.get(kind, 0.0) + spent
        return kinds

    def first_start(self) -> dict[str, tuple[float, int]]:
        """Per kind of process: when its first process started (wall clock) and how many started
        during the run (the driver and a running cluster's processes not counted)."""
        out: dict[str, tuple[float, int]] = {}
        for pid, (cmd, _) in self.seen.items():
            if pid == os.getpid() or pid in self._before:
                continue
            kind, at = self.kind(pid, cmd), self.started[pid]
            first, n = out.get(kind, (at, 0))
            out[kind] = (min(first, at), n + 1)
        return out


def with_ray(model: str, data: str, out: str, batch: int, actors: int, rows_per_file: int,
             address: str | None = None) -> dict:
    """The same job on Ray Data, on a local cluster started here or (``address``) on a running one;
    returns its timings (seconds from the start) and the actors' calls."""
    t0 = time.perf_counter()
    cpu = _ProcessCPU()  # counts import ray and ray.init too
    import ray

    from runtime_core.integrations.ray import Predictor

    log_dir = os.path.join(out + "_calls")
    os.makedirs(log_dir, exist_ok=True)

    class TimedPredictor(Predictor):
        """The Predictor, logging when it was built (and the actor's CPU seconds until then: the
        worker's start, its imports, the session) and each call's rows, wall and CPU seconds, end
        (wall clock) and the actor's CPU seconds since it started, so the job's time splits into
        start-up, scoring and Ray's work between calls (the fused read, Arrow <-> numpy)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._log = os.path.join(log_dir, f"{os.getpid()}.log")
            with open(self._log, "a") as f:
                f.write(f"{self.report['intra_op_num_threads']} 0 0 {time.time():.3f} {time.process_time():.3f}\n")

        def __call__(self, batch):
            t, c = time.perf_counter(), time.process_time()
            res = super().__call__(batch)
            with open(self._log, "a") as f:
                f.write(f"{len(batch['id'])} {time.perf_counter() - t:.4f} {time.process_time() - c:.4f} "
                        f"{time.time():.3f} {time.process_time():.3f}\n")
            return res

    wall0 = time.time() - (time.perf_counter() - t0)
    with cpu:
        if address:  # a user's cluster, already up: its daemons and Ray Data's detached actors too
            ray.init(address=address, log_to_driver=False)
            try:  # count its processes' CPU from now on (the session dir is in their command lines)
                cpu.add_cluster(ray._private.worker._global_node.get_session_dir_path())
            except AttributeError:  # another Ray: its processes are not counted
                pass
        else:
            # one logical CPU beyond the actors' for the write tasks: with none left, they never run
            ray.init(num_cpus=actors + 1, include_dashboard=False, log_to_driver=False)
        try:
            t_init = time.perf_counter() - t0
            ctx = ray.data.DataContext.get_current()
            ctx.enable_progress_bars = False
            # blocks of one batch: with batch_size=None each block is one Predictor call, which lets
            # Ray fuse the read into the actors (a batch_size stops the fusion): no read tasks and
            # no trip of the features through the object store
            row_bytes = sum(f.type.byte_width for f in pq.read_schema(data))
            ctx.target_max_block_size = batch * row_bytes
            # Ray 2.60's Parquet reader packs row groups into read units of up to this many bytes
            # (128 MiB: the whole file, one actor); units of ~2 batches give every actor work
            os.environ.setdefault("RAY_DATA_PARQUET_BIN_PACKING_BYTES", str(2 * batch * row_bytes))
            if hasattr(ctx, "parquet_chunker_target_chunk_size"):  # Ray 2.58 instead cuts the file
                # into byte ranges of this size (1 GiB by default): ~2 batches' share of the file
                ctx.parquet_chunker_target_chunk_size = os.path.getsize(data) * 2 * batch // pq.read_metadata(data).num_rows
            # and reads the footers on a pool of 32 actors by default: 32 Python processes started
            # on 2 cores to read one footer (the largest part of the start-up measured here)
            os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")
            (ray.data.read_parquet(data)
             .map_batches(TimedPredictor,
                          # outputs as a pyarrow Table: Ray takes it as the block, no per-value type inference
                          fn_constructor_kwargs={"model": model, "id_column": "id", "keep_columns": ["id"],
                                                 "output_format": "pyarrow"},
                          compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=1, batch_size=None,
                          batch_format="numpy")
             .write_parquet(out, min_rows_per_file=rows_per_file))  # a few write tasks, not one per block
            took = time.perf_counter() - t0
        finally:
            ray.shutdown()
    calls = {}
    for log in sorted(glob.glob(os.path.join(log_dir, "*.log"))):
        c = np.loadtxt(log, ndmin=2)
        c[:, 3] -= wall0
        calls[os.path.basename(log)[:-4]] = c
    return {"init": t_init, "total": took, "calls": calls, "cpu": cpu.by_kind(), "cpu_at": cpu.by_kind, "wall0": wall0,
            "starts": cpu.first_start()}


def report(rows: int, one: float, res: dict) -> None:
    took, calls = res["total"], res["calls"]
    where = f"on the running cluster {res['address']}" if res["address"] else "on a local cluster started here"
    print(f"Ray Data, 2 actors x 1 thread {where}: {rows / took:,.0f} rows/s ({took:.1f} s from before `import ray`, "
          f"ray.init {res['init']:.1f} s; {rows / (took - res['init']):,.0f} rows/s without ray.init)")
    for pid, c in calls.items():
        work = c[1:]
        print(f"  actor pid {pid}: {int(c[0, 0])} intra-op thread, ready at {c[0, 3]:.1f} s, {len(work)} batches, "
              f"{int(work[:, 0].sum()):,} rows, {work[:, 1].sum():.1f} s inside the Predictor "
              f"({work[:, 2].sum():.1f} s CPU), last batch done at {work[-1, 3]:.1f} s")
        between = work[-1, 4] - c[0, 4] - work[:, 2].sum()
        print(f"    CPU s: {c[0, 4]:.1f} to start (worker, imports, session), {work[:, 2].sum():.1f} inside the "
              f"Predictor ({work[:, 2].sum() / work[:, 0].sum() * 1e6:.1f} per 1M rows), {between:.1f} between calls "
              f"(Ray: the fused Parquet read, Arrow <-> numpy, the output block; {between / work[:, 0].sum() * 1e6:.1f}"
              " per 1M rows)")
        if len(work) > 1:  # from its first call's end to its last's: time outside the Predictor, and its CPU
            gap_wall = work[-1, 3] - work[0, 3] - work[1:, 1].sum()
            gap_cpu = work[-1, 4] - work[0, 4] - work[1:, 2].sum()
            print(f"    between its first and last call: {gap_wall:.1f} s of wall outside the Predictor, {gap_cpu:.1f} "
                  "s of it on a CPU (the rest waited: for its next block from Ray or, on a loaded machine, for a core)")
    # the steady state: from the moment every actor has scored a batch to the first actor's last one
    works = [c[1:] for c in calls.values() if len(c) > 1]
    start, end = max(w[0, 3] for w in works), min(w[-1, 3] for w in works)
    done = sum(w[(w[:, 3] > start) & (w[:, 3] <= end), 0].sum() for w in works)
    print(f"ratio Ray / in-process, end to end: {one / took:.2f}x (without ray.init {one / (took - res['init']):.2f}x)")
    if len(works) == len(calls) > 1 and end > start:
        steady = done / (end - start)
        print(f"  steady state, {start:.1f}-{end:.1f} s: the actors together {steady:,.0f} rows/s = "
              f"{steady / (rows / one):.2f}x the in-process rate; the rest of the Ray time ({took - rows / steady:.1f} s) "
              "is start-up and the tail")
        target = 1.6 * rows / one
        if steady > target:
            need = (took - rows / steady) / (1 / target - 1 / steady)
            print(f"  at these rates the end-to-end ratio reaches 1.6x from about {need:,.0f} rows")
        else:
            print("  the steady state measured here is below 1.6x: at these rates no job size reaches it")
        # the same CPU seconds split by phase: what Ray spends beside the actors while both score
        # is what keeps the steady state under 2x; the rest is paid per job
        phases = {"start-up": (0.0, start), "steady": (start, end), "tail": (end, took)}
        split = {name: res["cpu_at"]((res["wall0"] + a, res["wall0"] + b)) for name, (a, b) in phases.items()}
        if any(split.values()):
            print(f"  CPU seconds by phase (start-up 0-{start:.1f} s, steady {start:.1f}-{end:.1f} s, tail to "
                  f"{took:.1f} s; {os.cpu_count()} cores give {os.cpu_count() * (end - start):.1f} CPU s in the "
                  "steady phase; /proc sampled every 0.5 s):")
            # in the order the processes started: the chain of the start-up (the driver first, at 0)
            starts = {k: (at - res["wall0"], n) for k, (at, n) in res["starts"].items()}
            kinds = sorted(res["cpu"], key=lambda k: (starts.get(k, (0.0, 0))[0], -res["cpu"][k]))
            print("    start-up  steady    tail  started at (s, processes)")
            for kind in kinds:
                at, n = starts.get(kind, (0.0, 1))
                print("    " + "  ".join(f"{split[p].get(kind, 0.0):6.1f}" for p in phases)
                      + f"  {at:6.1f} x{n:<3d} {kind}")
            print("    " + "  ".join(f"{sum(split[p].values()):6.1f}" for p in phases) + "  in all")
    if res["cpu"]:
        print("  CPU seconds by process (all of Ray, from before ray.init to its shutdown"
              + (", the running cluster's processes only what they spent meanwhile):" if res["address"] else "):"))
        for kind, sec in sorted(res["cpu"].items(), key=lambda kv: -kv[1]):
            print(f"    {sec:6.1f}  {kind}")
        print(f"    {sum(res['cpu'].values()):6.1f}  in all (the in-process job: {res['in_process_cpu']:.1f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--trees", type=int, default=300, help="boosting rounds (x3 classes trees)")
    ap.add_argument("--batch", type=int, default=25_000)
    ap.add_argument("--rows-per-file", type=int, default=250_000, help="Ray's write_parquet(min_rows_per_file=)")
    ap.add_argument("--out", default="ray_parquet_out")
    ap.add_argument("--address", help="run the Ray side on this running cluster (e.g. 'auto' after `ray start --head "
                    "--num-cpus 3 --include-dashboard false`) instead of a local one started by the script: the "
                    "cluster's start is then not in the time, as for a job submitted to a cluster")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model, data = make(args.out, args.rows, args.trees)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; {args.trees} rounds x 3 "
          f"classes, {args.rows:,} rows, batches of {args.batch:,}", flush=True)
    c = time.process_time()
    one, in_pred = in_process(model, data, os.path.join(args.out, "predictions_in_process.parquet"), args.batch)
    in_cpu = time.process_time() - c
    print(f"in-process, 1 session x 1 thread: {args.rows / one:,.0f} rows/s ({one:.1f} s, {in_cpu:.1f} s CPU, "
          f"{in_pred:.1f} of it inside the Predictor: {in_pred / args.rows * 1e6:.1f} per 1M rows)", flush=True)
    ray_dir = os.path.join(args.out, "predictions_ray")
    for old in (ray_dir, ray_dir + "_calls"):  # a previous run's files would be read back too
        shutil.rmtree(old, ignore_errors=True)
    res = with_ray(model, data, ray_dir, args.batch, actors=2, rows_per_file=args.rows_per_file, address=args.address)
    res["in_process_cpu"] = in_cpu
    res["address"] = args.address
    report(args.rows, one, res)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print("command: python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]))
    a = pq.read_table(os.path.join(args.out, "predictions_in_process.parquet")).to_pandas().sort_values("id")
    b = pq.read_table(ray_dir).to_pandas().sort_values("id")
    assert len(a) == len(b) == args.rows
    for c in a.columns:
        np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=1e-6)
    print(f"same {len(a):,} predictions, columns {list(a.columns)}")


if __name__ == "__main__":
    main()
