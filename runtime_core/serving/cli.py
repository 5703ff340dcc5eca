"""``runtime-core serve``: serve models over the Open Inference Protocol v2 (extra ``runtime-core[serve]``)."""

from __future__ import annotations

import json
import logging
import sys

from ..cli_args import UsageError, check_readable, float_at_least, int_at_least


class JsonFormatter(logging.Formatter):
    """Log records as JSON lines; access-log records are JSON already and pass through."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.name.endswith(".access"):
            return msg
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
                 "msg": msg}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str = "info", access_log: bool = True) -> None:
    """JSON lines on stderr for the server's loggers (uvicorn's own access log is off: ours replaces it)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("runtime_core", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(level.upper())
        lg.propagate = False
    logging.getLogger("runtime_core.serving.access").disabled = not access_log


def build_config(args):
    """The :class:`ServerConfig` from the command line and the optional ``--config`` file."""
    from .config import ModelConfig, ServerConfig, load_config_file

    server, entries = load_config_file(args.config) if args.config else ({}, [])
    if args.name and len(args.name) != len(args.models):
        raise UsageError(f"--name is given {len(args.name)} time(s) for {len(args.models)} model(s); "
                         "give one --name per MODEL, in the same order")
    providers = [p.strip() for p in args.providers.split(",") if p.strip()] if args.providers else None
    defaults = {"max_batch_size": args.max_batch_size, "max_queue_delay_ms": args.max_queue_delay_ms,
                "max_concurrency": args.max_concurrency, "timeout_s": args.timeout, "threads": args.threads}
    for i, path in enumerate(args.models):
        entries.append({"path": path, **({"name": args.name[i]} if args.name else {})})
    if not entries:
        raise UsageError("give at least one MODEL (or a --config file that lists models)")
    models = []
    for m in entries:
        check_readable(m["path"], "model file")
        merged = {**defaults, **({"providers": providers} if providers else {}), **m}
        models.append(ModelConfig(**merged))
    for key, val in (("host", args.host), ("port", args.port), ("max_request_bytes",
                     int(args.max_request_mb * 1024 * 1024) if args.max_request_mb is not None else None)):
        if val is not None:
            server[key] = val
    try:
        return ServerConfig(models=models, **server)
    except TypeError as exc:
        raise UsageError(f"--config: {exc}") from None


def _check_port(host: str, port: int) -> None:
    """A port that cannot be listened on is a usage error, found before any model loads."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise UsageError(f"--host {host!r}: {exc.strerror or exc}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
        try:
            s.bind(addr)
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def cmd_serve(args, out) -> int:
    try:
        import uvicorn  # noqa: F401
        import starlette  # noqa: F401
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"runtime-core serve needs the 'serve' extra ({exc.name} is missing): "
                         "pip install 'runtime-core[serve]'") from None
    cfg = build_config(args)
    _check_port(cfg.host, cfg.port)
    from .model import ServedModel
    from .server import serve

    models = [ServedModel(c) for c in cfg.models]  # a model that does not load: one error line, exit 2
    configure_logging(args.log_level, not args.no_access_log)
    serve(cfg, models)
    return 0


def register(subparsers) -> None:
    """Add ``serve``."""
    sp = subparsers.add_parser("serve", help="serve models over the Open Inference Protocol v2 (HTTP)")
    sp.add_argument("models", nargs="*", metavar="MODEL", help=".onnx files to serve")
    sp.add_argument("--name", action="append", help="a model's name (one per MODEL, in order; default: file stem)")
    sp.add_argument("--config", metavar="FILE", help="JSON file with server settings and models")
    sp.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    sp.add_argument("--port", type=int_at_least(0), help="port (default 8000; 0: any free port)")
    sp.add_argument("--providers", help="comma-separated provider names in priority order, for every model")
    sp.add_argument("--threads", type=int_at_least(0), default=0, help="intra-op threads per model")
    sp.add_argument("--max-batch-size", type=int_at_least(0), default=0,
                    help="dynamic batching: rows per run (0 or 1: off); only for models with a free batch dim")
    sp.add_argument("--max-queue-delay-ms", type=float_at_least(0), default=2.0,
                    help="dynamic batching: how long a batch waits to fill")
    sp.add_argument("--max-concurrency", type=int_at_least(1), default=1, help="runs at a time per model")
    sp.add_argument("--timeout", type=float_at_least(0.001), default=60.0,
                    help="seconds a request may take; its run is terminated past it")
    sp.add_argument("--max-request-mb", type=float_at_least(0), help="request body limit in MiB (default 64)")
    sp.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sp.add_argument("--no-access-log", action="store_true", help="no JSON line per request")
    sp.set_defaults(fn=cmd_serve)
