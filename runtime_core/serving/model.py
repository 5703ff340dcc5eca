"""One served model: its session, the bound on concurrent runs, the per-request timeout and the
dynamic batcher (requests of the same signature joined along the batch dimension)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..errors import RunTerminatedError
from .codec import datatype_of_onnx
from .config import ModelConfig
from .errors import RequestError, RequestTimeoutError, ServerBusyError

logger = logging.getLogger("runtime_core.serving")

VERSION = "1"


@dataclass
class RunInfo:
    """How a request was run: seconds it waited for a run, and the batch it ran in."""

    queue_s: float = 0.0
    batch_size: int = 1


@dataclass
class _Item:
    feeds: dict
    names: list
    rows: int
    signature: tuple
    deadline: float
    enqueued: float
    future: asyncio.Future = field(repr=False, default=None)  # type: ignore[assignment]


def batchable(args) -> bool:
    """Whether inputs and outputs (NodeArgs) look batch-major: every first dimension is free, the
    named ones share one name, and that name appears nowhere else (``x[n, n]`` is not a batch)."""
    if not args or any(not a.shape or isinstance(a.shape[0], int) for a in args):
        return False
    names = {a.shape[0] for a in args if isinstance(a.shape[0], str)}
    return len(names) <= 1 and not any(d in names for a in args for d in a.shape[1:])


class ServedModel:
    """A model behind the server; ``infer`` is called on the server's event loop."""

    def __init__(self, cfg: ModelConfig, session=None):
        import runtime_core as rt

        self.cfg = cfg
        self.name = cfg.name
        if session is None:
            so = rt.SessionOptions()
            if cfg.threads:
                so.intra_op_num_threads = cfg.threads
            session = rt.InferenceSession(cfg.path, so, providers=cfg.providers)
        self.session = session
        self.inputs = session.get_inputs()
        self.outputs = session.get_outputs()
        self.output_names = [o.name for o in self.outputs]
        self.batchable = bool(self.inputs) and batchable(self.inputs + self.outputs)
        self.batching = cfg.max_batch_size > 1 and self.batchable
        if cfg.max_batch_size > 1 and not self.batchable:
            logger.warning("model %r: dynamic batching is off: its inputs and outputs do not share a free "
                           "first (batch) dimension", self.name)
        self._pool = ThreadPoolExecutor(max_workers=cfg.max_concurrency, thread_name_prefix=f"serve-{self.name}")
        self._sem: asyncio.Semaphore | None = None
        self._items: deque[_Item] = deque()
        self._wake: asyncio.Event | None = None
        self._batcher: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()
        self._accepted: set[tuple] = set()  # feed signatures validate_inputs returned unchanged
        self.ready = False
        #: called with (model name, batch rows) for every run, (model name, seconds) for queue waits,
        #: and (model name) for each run stopped by a timeout
        self.on_batch = lambda name, rows: None
        self.on_queue = lambda name, seconds: None
        self.on_terminated = lambda name: None

    # -- metadata ---------------------------------------------------------------
    def metadata(self) -> dict:
        """The OIP model metadata response."""
        def t(a) -> dict:
            return {"name": a.name, "datatype": datatype_of_onnx(a.type),
                    "shape": [d if isinstance(d, int) else -1 for d in (a.shape or [])]}
        return {"name": self.name, "versions": [VERSION], "platform": "onnx",
                "inputs": [t(a) for a in self.inputs], "outputs": [t(a) for a in self.outputs]}

    def config(self) -> dict:
        """A Triton-style model config (``GET .../config``): what batching and limits apply."""
        return {"name": self.name, "platform": "onnxruntime_onnx", "backend": "runtime_core",
                "max_batch_size": self.cfg.max_batch_size if self.batching else 0,
                "dynamic_batching": {"max_queue_delay_microseconds": int(self.cfg.max_queue_delay_ms * 1000)}
                if self.batching else None,
                "instance_group": [{"count": self.cfg.max_concurrency, "kind": "KIND_CPU"}],
                "providers": self.session.get_providers(), "timeout_s": self.cfg.timeout_s}

    # -- life cycle ---------------------------------------------------------------
    async def start(self) -> None:
        self._sem = asyncio.Semaphore(self.cfg.max_concurrency)
        self._wake = asyncio.Event()
        if self.batching:
            self._batcher = asyncio.create_task(self._batch_loop(), name=f"batcher-{self.name}")
        self.ready = True

    async def stop(self) -> None:
        """Finish what is queued and running, then release the threads."""
        self.ready = False
        while self._items or self._running:
            await asyncio.sleep(0.01)
        if self._batcher is not None:
            self._batcher.cancel()
            try:
                await self._batcher
            except asyncio.CancelledError:
                pass
        self._pool.shutdown(wait=True)

    # -- inference ----------------------------------------------------------------
    async def infer(self, feeds: dict, output_names: list[str] | None) -> tuple[list, RunInfo]:
        """Run one request; raises the session's typed errors, :class:`RequestTimeoutError` past
        the timeout, :class:`ServerBusyError` when the queue is full."""
        if not self.ready:
            raise ServerBusyError(f"model {self.name!r} is not ready (the server is starting or stopping)")
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + self.cfg.timeout_s
        names = list(output_names) if output_names else list(self.output_names)
        if self.batching:
            feeds = self._checked(feeds, names)
            rows = {int(v.shape[0]) for v in feeds.values()}
            if len(rows) == 1 and (r := rows.pop()) <= self.cfg.max_batch_size:
                if len(self._items) >= self.cfg.max_queue:
                    raise ServerBusyError(f"model {self.name!r}: {len(self._items)} requests are queued "
                                          f"(max_queue {self.cfg.max_queue}); try again later")
                sig = (tuple(sorted((k, v.dtype.str, v.shape[1:]) for k, v in feeds.items())), tuple(names))
                item = _Item(feeds, names, r, sig, deadline, now, loop.create_future())
                self._items.append(item)
                assert self._wake is not None
                self._wake.set()
                # one timer that fails the future (cheaper than asyncio.wait's waiter and callbacks)
                timer = loop.call_at(deadline, self._expire, item.future)
                try:
                    return await item.future
                finally:
                    timer.cancel()
        return await self._run_single(feeds, names, deadline, now)

    def _expire(self, fut: asyncio.Future) -> None:
        if not fut.done():  # the batcher skips a request whose future is done
            fut.set_exception(RequestTimeoutError(f"model {self.name!r}: the request took longer than "
                                                  f"timeout_s={self.cfg.timeout_s:g} s"))

    def _checked(self, feeds: dict, names: list[str]) -> dict:
        """The session's own checks and messages, before the request joins a batch. A signature
        (names, dtypes, shapes, outputs) the session took unchanged once is not checked again."""
        # numeric arrays only: the checks of strings and objects look at the elements
        plain = all(isinstance(v, np.ndarray) and v.dtype.kind in "biuf" and v.dtype.isnative
                    and v.flags.c_contiguous for v in feeds.values())
        key = (tuple((k, v.dtype.str, v.shape) for k, v in feeds.items()), tuple(names)) if plain else None
        if key is not None and key in self._accepted:
            return feeds
        checked = self.session.validate_inputs(feeds, names)
        if key is not None and checked.keys() == feeds.keys() and all(checked[k] is v for k, v in feeds.items()):
            if len(self._accepted) >= 1024:  # bounded: shapes are the client's choice
                self._accepted.clear()
            self._accepted.add(key)
        return checked

    async def _run_single(self, feeds, names, deadline, arrived) -> tuple[list, RunInfo]:
        loop = asyncio.get_running_loop()
        assert self._sem is not None
        if self._sem.locked():  # a free slot is taken at once, without a timer
            try:
                await asyncio.wait_for(self._sem.acquire(), max(deadline - loop.time(), 0))
            except asyncio.TimeoutError:
                raise RequestTimeoutError(f"model {self.name!r}: no run slot within timeout_s="
                                          f"{self.cfg.timeout_s:g} s") from None
        else:
            await self._sem.acquire()
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        info = RunInfo(queue_s=loop.time() - arrived, batch_size=1)
        self.on_queue(self.name, info.queue_s)
        self.on_batch(self.name, 1)
        try:
            return await self._call(feeds, names, deadline), info
        finally:
            self._running.discard(task)
            self._sem.release()

    async def _call(self, feeds, names, deadline) -> list:
        """Run in a worker thread; past the deadline, set ``terminate`` and wait for the run to end
        (the slot stays taken until it has, so the concurrency bound holds)."""
        import runtime_core as rt

        loop = asyncio.get_running_loop()
        ro = rt.RunOptions()
        fut = loop.run_in_executor(self._pool, self.session.run, names, feeds, ro)
        # asyncio.wait leaves the run's future alone at the timeout (no shield, no extra task)
        await asyncio.wait((fut,), timeout=max(deadline - loop.time(), 0))
        if fut.done():
            return fut.result()
        ro.terminate = True
        try:
            await fut
        except RunTerminatedError:
            self.on_terminated(self.name)
        except Exception:  # the run failed on its own while being stopped: the timeout is the answer
            pass
        raise RequestTimeoutError(f"model {self.name!r}: the run took longer than timeout_s="
                                  f"{self.cfg.timeout_s:g} s and was terminated") from None

    async def _batch_loop(self) -> None:
        """Take a run slot, then gather queued requests of the first one's signature (waiting at
        most ``max_queue_delay_ms`` for more) into one run."""
        loop = asyncio.get_running_loop()
        assert self._sem is not None and self._wake is not None
        delay = self.cfg.max_queue_delay_ms / 1000
        cap = self.cfg.max_batch_size
        while True:
            await self._sem.acquire()
            while not self._items:
                self._wake.clear()
                await self._wake.wait()
            first = self._items.popleft()
            batch, rows = [first], first.rows
            until = loop.time() + delay
            while rows < cap:
                taken = False
                for it in list(self._items):
                    if it.signature == first.signature and rows + it.rows <= cap:
                        self._items.remove(it)
                        batch.append(it)
                        rows += it.rows
                        taken = True
                        if rows >= cap:
                            break
                if rows >= cap:
                    break
                left = until - loop.time()
                if left <= 0:
                    break
                if not taken:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), left)
                    except asyncio.TimeoutError:
                        pass
            task = asyncio.create_task(self._run_batch(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run_batch(self, batch: list[_Item]) -> None:
        loop = asyncio.get_running_loop()
        assert self._sem is not None
        try:
            live = [it for it in batch if not it.future.done()]
            if not live:
                return
            now = loop.time()
            for it in live:
                self.on_queue(self.name, now - it.enqueued)
            rows = sum(it.rows for it in live)
            self.on_batch(self.name, rows)
            feeds = live[0].feeds if len(live) == 1 else {
                k: np.concatenate([it.feeds[k] for it in live]) for k in live[0].feeds}
            failure: Exception | None = None
            try:
                outs = await self._call(feeds, live[0].names, max(it.deadline for it in live))
                if len(live) > 1 and not all(np.ndim(o) > 0 and np.shape(o)[0] == rows for o in outs):
                    failure = RequestError(f"model {self.name!r}: an output does not have the {rows} row(s) of "
                                           "its input; the model cannot be batched (serve it with max_batch_size 0)")
            except Exception as exc:
                outs, failure = [], exc
            if failure is not None and len(live) > 1 and not isinstance(failure, RequestTimeoutError):
                # rows that only fail together (the first dimension is not a batch): each runs alone
                logger.warning("model %r: a batch of %d requests failed (%s); running each alone", self.name,
                               len(live), failure)
                for it in live:
                    await self._alone(it)
                return
            start = 0
            for it in live:
                if not it.future.done():
                    if failure is None:
                        it.future.set_result(([o[start:start + it.rows] for o in outs],
                                              RunInfo(queue_s=now - it.enqueued, batch_size=rows)))
                    else:
                        it.future.set_exception(failure)
                start += it.rows
        finally:
            self._sem.release()

    async def _alone(self, it: _Item) -> None:
        """Run one request of a failed batch by itself (the batch's run slot is still held)."""
        try:
            outs = await self._call(it.feeds, it.names, it.deadline)
        except Exception as exc:
            if not it.future.done():
                it.future.set_exception(exc)
            return
        if not it.future.done():
            it.future.set_result((outs, RunInfo(queue_s=0.0, batch_size=it.rows)))
