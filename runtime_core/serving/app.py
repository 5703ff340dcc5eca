"""The ASGI application: Open Inference Protocol v2 REST routes on Starlette, ``/metrics``, the page
at ``/``, JSON access logs, and the request size limit."""

from __future__ import annotations

import contextlib
import json
import logging
import time
import zlib

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from .._version import __version__
from ..errors import RuntimeCoreError
from .codec import HEADER_LENGTH, decode_request, encode_response
from .config import ServerConfig
from .errors import ModelNotFoundError, RequestError, RequestTooLargeError, http_status
from .model import VERSION, ServedModel

logger = logging.getLogger("runtime_core.serving")
access_logger = logging.getLogger("runtime_core.serving.access")

EXTENSIONS = ["binary_tensor_data", "model_configuration", "metrics"]
_LATENCY_BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """The Prometheus series, in a registry of their own (two apps in one process do not clash)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("runtime_core_inference_requests", "Inference requests received",
                                ["model"], registry=r)
        self.errors = Counter("runtime_core_inference_errors", "Inference requests answered with an error",
                              ["model", "status"], registry=r)
        self.latency = Histogram("runtime_core_inference_latency_seconds",
                                 "Inference request latency, body read to response", ["model"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("runtime_core_inference_queue_seconds",
                               "Time a request waited for a run slot or a batch", ["model"],
                               buckets=_LATENCY_BUCKETS, registry=r)
        self.batch = Histogram("runtime_core_inference_batch_rows", "Rows (batch size) of each model run",
                               ["model"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.terminated = Counter("runtime_core_inference_terminated", "Runs stopped past the request timeout",
                                  ["model"], registry=r)
        self.http = Counter("runtime_core_http_requests", "HTTP requests by route and status",
                            ["route", "status"], registry=r)


def _error(exc: BaseException) -> JSONResponse:
    msg = str(exc) if isinstance(exc, RuntimeCoreError) else f"{type(exc).__name__}: {exc}"
    return JSONResponse({"error": msg}, status_code=http_status(exc))


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with :class:`RequestTooLargeError` as soon as it passes ``limit`` bytes
    (declared or streamed); gzip/deflate bodies are limited after decompression too."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(f"the request body is {int(declared)} bytes; this server takes at most {limit} "
                                   "(max_request_bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"the request body passed {limit} bytes, this server's limit "
                                       "(max_request_bytes)")
        chunks.append(chunk)
    body = b"".join(chunks)
    enc = (request.headers.get("content-encoding") or "identity").lower()
    if enc in ("gzip", "deflate"):
        d = zlib.decompressobj(wbits=31 if enc == "gzip" else 15)
        try:
            body = d.decompress(body, limit + 1)
        except zlib.error as exc:
            raise RequestError(f"the body is not valid {enc} data: {exc}") from None
        if len(body) > limit:
            raise RequestTooLargeError(f"the {enc} body inflates past {limit} bytes (max_request_bytes)")
    elif enc != "identity":
        raise RequestError(f"Content-Encoding {enc!r} is not supported (gzip, deflate or identity)")
    return body


class AccessLog:
    """ASGI middleware: one JSON line per request (method, path, status, bytes, milliseconds)
    on the ``runtime_core.serving.access`` logger, and the HTTP request counter."""

    def __init__(self, app, metrics: Metrics, fast=None):
        self.app = app
        self.metrics = metrics
        #: scope -> an ASGI app that answers it past the router, or None (the inference route)
        self.fast = fast or (lambda scope: None)
        self._series: dict[tuple, object] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        seen = {"status": 500, "bytes": 0}

        async def wrapped(message):
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body":
                seen["bytes"] += len(message.get("body", b""))
            await send(message)

        try:
            await (self.fast(scope) or self.app)(scope, receive, wrapped)
        finally:
            path = scope.get("path", "")
            route = _route_of(path)
            key = (route, seen["status"])
            child = self._series.get(key)
            if child is None:  # a handful of (route, status) pairs: each series looked up once
                child = self._series[key] = self.metrics.http.labels(route, str(seen["status"]))
            child.inc()
            client = scope.get("client")
            if not access_logger.disabled and access_logger.isEnabledFor(logging.INFO):
                access_logger.info(json.dumps({
                    "ts": round(time.time(), 3), "method": scope.get("method"), "path": path, "route": route,
                    "status": seen["status"], "bytes": seen["bytes"],
                    "ms": round((time.perf_counter() - t0) * 1e3, 3),
                    "client": f"{client[0]}:{client[1]}" if client else None}))


def _route_of(path: str) -> str:
    """A low-cardinality label for a path (model names stay out of the HTTP counter)."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["v2", "models"] and len(parts) > 2:
        rest = parts[3:]
        if rest[:1] == ["versions"]:
            rest = rest[2:]
        return "/v2/models/{name}" + ("/" + "/".join(rest) if rest else "")
    return path if path in ("/", "/metrics", "/v2", "/v2/health/live", "/v2/health/ready") else "other"


def create_app(config: ServerConfig, models: list[ServedModel] | None = None) -> Starlette:
    """The server's ASGI app; ``models`` (already loaded) default to loading ``config.models``."""
    from .page import render_page

    served = {m.name: m for m in (models if models is not None else [ServedModel(c) for c in config.models])}
    metrics = Metrics()
    for m in served.values():
        # each model's series looked up once, not on every request
        m.on_batch = lambda name, rows, h=metrics.batch.labels(m.name): h.observe(rows)
        m.on_queue = lambda name, s, h=metrics.queue.labels(m.name): h.observe(s)
        m.on_terminated = lambda name: metrics.terminated.labels(name).inc()
    state = {"ready": False, "page": None}
    per_model: dict[str, tuple] = {}  # label -> (request counter, latency histogram)

    def model_of(request: Request) -> ServedModel:
        name = request.path_params["name"]
        m = served.get(name)
        if m is None:
            raise ModelNotFoundError(f"no model named {name!r} is served (models: {', '.join(served) or 'none'})")
        version = request.path_params.get("version")
        if version is not None and version != VERSION:
            raise ModelNotFoundError(f"model {name!r} has no version {version!r} (versions: {VERSION})")
        return m

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        ok = state["ready"] and all(m.ready for m in served.values())
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def server_meta(request: Request) -> Response:
        return JSONResponse({"name": "runtime-core", "version": __version__, "extensions": EXTENSIONS})

    async def model_meta(request: Request) -> Response:
        try:
            return JSONResponse(model_of(request).metadata())
        except RuntimeCoreError as exc:
            return _error(exc)

    async def model_config(request: Request) -> Response:
        try:
            return JSONResponse(model_of(request).config())
        except RuntimeCoreError as exc:
            return _error(exc)

    async def model_ready(request: Request) -> Response:
        try:
            m = model_of(request)
        except RuntimeCoreError as exc:
            return _error(exc)
        return JSONResponse({"name": m.name, "ready": m.ready}, status_code=200 if m.ready else 503)

    async def infer(request: Request) -> Response:
        t0 = time.perf_counter()
        label = request.path_params["name"] if request.path_params["name"] in served else "(unknown)"
        series = per_model.get(label)
        if series is None:
            series = per_model[label] = (metrics.requests.labels(label), metrics.latency.labels(label))
        series[0].inc()
        try:
            m = model_of(request)
            body = await read_body(request, config.max_request_bytes)
            req = decode_request(body, request.headers.get(HEADER_LENGTH))
            del body
            names = list(req.outputs) or None
            outs, info = await m.infer(req.inputs, names)
            binary = req.outputs if req.outputs else {n: req.binary_default for n in m.output_names}
            payload, hlen = encode_response(m.name, VERSION, req.id,
                                            [(n, v, binary[n]) for n, v in zip(names or m.output_names, outs)])
        except Exception as exc:  # every failure is answered; the server keeps serving
            status = http_status(exc)
            metrics.errors.labels(label, str(status)).inc()
            if status >= 500 and not isinstance(exc, RuntimeCoreError):
                logger.exception("model %r: the request failed", label)
            return _error(exc)
        finally:
            series[1].observe(time.perf_counter() - t0)
        headers = {"X-Queue-Ms": f"{info.queue_s * 1e3:.3f}", "X-Batch-Rows": str(info.batch_size)}
        if hlen is None:
            return Response(payload, media_type="application/json", headers=headers)
        headers["Inference-Header-Content-Length"] = str(hlen)
        return Response(payload, media_type="application/octet-stream", headers=headers)

    async def metrics_route(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def page(request: Request) -> Response:
        if state["page"] is None:
            state["page"] = render_page(list(served.values()))
        return HTMLResponse(state["page"])

    @contextlib.asynccontextmanager
    async def lifespan(app):
        for m in served.values():
            await m.start()
        state["ready"] = True
        logger.info("serving %s", ", ".join(served) or "no models")
        try:
            yield
        finally:
            state["ready"] = False  # uvicorn has finished the in-flight requests by now
            for m in served.values():
                await m.stop()
            logger.info("stopped")

    # inference first: the router tries routes in order, and nearly every request is one
    model_routes = [Route(prefix + "/infer", infer, methods=["POST"]) for prefix in
                    ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")]
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        model_routes += [
            Route(prefix, model_meta, methods=["GET"]),
            Route(prefix + "/ready", model_ready, methods=["GET"]),
            Route(prefix + "/config", model_config, methods=["GET"]),
        ]
    routes = [
        *model_routes[:2],
        Route("/", page, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
        Route("/v2", server_meta, methods=["GET"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        *model_routes[2:],
    ]

    async def not_found(request: Request, exc) -> Response:
        status = getattr(exc, "status_code", 404)
        return JSONResponse({"error": f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}"},
                            status_code=status)

    async def infer_asgi(scope, receive, send) -> None:
        response = await infer(Request(scope, receive, send))
        await response(scope, receive, send)

    def fast(scope) -> object | None:
        """``infer_asgi`` for ``POST /v2/models/{name}[/versions/{version}]/infer`` (the routes'
        own matching: segments without '/'), skipping the router and exception layers that every
        other route goes through; nearly every request is one."""
        if scope.get("method") != "POST" or not scope.get("path", "").endswith("/infer"):
            return None
        parts = scope["path"].split("/")
        if parts[:3] != ["", "v2", "models"] or not all(parts[3:-1]):
            return None
        if len(parts) == 5:
            scope["path_params"] = {"name": parts[3]}
        elif len(parts) == 7 and parts[4] == "versions":
            scope["path_params"] = {"name": parts[3], "version": parts[5]}
        else:
            return None
        return infer_asgi

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    app.state.models = served
    app.state.metrics = metrics
    app.add_middleware(AccessLog, metrics=metrics, fast=fast)
    return app
