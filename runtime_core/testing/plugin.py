"""The kit's pytest plugin (entry point ``runtime_core`` in the ``pytest11`` group).

Options:

* ``--runtime-provider NAME``: run the conformance suite on the installed provider
  ``NAME`` (ORT name or alias), in addition to whatever else pytest collects;
* ``--runtime-provider-option KEY=VALUE`` (repeatable): a provider option of every
  session the kit builds;
* ``--runtime-provider-cases REGEX``: only cases whose ``folder/name`` matches;
* ``--runtime-provider-folders LIST``: suite folders (default ``node``);
* ``--runtime-provider-timeout SECONDS``: a case running longer fails as a hang;
* ``--runtime-provider-tolerance OP=RTOL,ATOL`` (repeatable): the least tolerance of every
  float output of a case with op ``OP`` (``DFT``, ``com.microsoft::Attention``); a dtype
  name (``float32``) instead of an op sets that dtype's tolerance.

A failing case says where its model and data sets are: generated node cases live under
``$RUNTIME_CORE_CACHE`` (default ``~/.cache/runtime-core``), the other folders in the
installed ``onnx`` package.

At the end of the run it prints each checked provider's summary: claimed ops,
passed, failed, declined. Without ``--runtime-provider`` it adds nothing to a run
(a test module that subclasses :class:`~runtime_core.testing.suite.ProviderConformance`
runs the kit without the option).
"""

from __future__ import annotations

from pathlib import Path

import pytest

SUITE_FILE = Path(__file__).with_name("_collect_suite.py")


def pytest_addoption(parser) -> None:
    """Add the kit's command-line options."""
    group = parser.getgroup("runtime-core", "runtime-core provider conformance kit")
    group.addoption("--runtime-provider", metavar="NAME", default=None,
                    help="run the runtime-core conformance kit on the installed provider NAME")
    group.addoption("--runtime-provider-option", metavar="KEY=VALUE", action="append", default=[],
                    help="a provider option for every session the kit builds (repeatable)")
    group.addoption("--runtime-provider-cases", metavar="REGEX", default=None,
                    help="only the ONNX backend cases whose folder/name matches REGEX")
    group.addoption("--runtime-provider-folders", metavar="LIST", default=None,
                    help="comma-separated ONNX backend suite folders (default: node)")
    group.addoption("--runtime-provider-timeout", metavar="SECONDS", type=float, default=None,
                    help="a case that runs longer fails as a hang (default: 120)")
    group.addoption("--runtime-provider-tolerance", metavar="OP=RTOL,ATOL", action="append", default=[],
                    help="least tolerance of the float outputs of a case with op OP (repeatable); "
                         "a dtype name (float32) instead of OP sets that dtype's tolerance")


def cli_settings(config) -> dict:
    """The kit's command-line settings: provider, options, cases, folders."""
    opts = {}
    for spec in config.getoption("--runtime-provider-option", default=[]) or []:
        if "=" not in spec:
            raise pytest.UsageError(f"--runtime-provider-option takes KEY=VALUE, got {spec!r}")
        k, v = spec.split("=", 1)
        opts[k.strip()] = v
    folders = config.getoption("--runtime-provider-folders", default=None)
    from .compare import DEFAULT_TOLERANCES, parse_tolerance

    dtype_tol, op_tol = {}, {}
    for spec in config.getoption("--runtime-provider-tolerance", default=[]) or []:
        try:
            key, tol = parse_tolerance(spec)
        except ValueError as exc:
            raise pytest.UsageError(f"--runtime-provider-tolerance: {exc}") from None
        (dtype_tol if key in DEFAULT_TOLERANCES else op_tol)[key] = tol
    return {
        "provider": config.getoption("--runtime-provider", default=None),
        "options": opts,
        "cases": config.getoption("--runtime-provider-cases", default=None),
        "folders": tuple(f.strip() for f in folders.split(",") if f.strip()) if folders else None,
        "timeout": config.getoption("--runtime-provider-timeout", default=None),
        "tolerances": dtype_tol,
        "op_tolerances": op_tol,
    }


def pytest_configure(config) -> None:
    """With ``--runtime-provider``, add the kit's suite to what pytest collects."""
    settings = cli_settings(config)
    if settings["provider"]:
        from ..conformance.cases import FOLDERS

        bad = [f for f in settings["folders"] or () if f not in FOLDERS]
        if bad:
            raise pytest.UsageError(f"--runtime-provider-folders: unknown folder(s) {bad}; "
                                    f"the folders are {', '.join(FOLDERS)}")
        config.args = [*config.args, str(SUITE_FILE)]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Print the summary of every provider the kit checked in this run."""
    from .suite import all_kits

    for kit in all_kits(config):
        terminalreporter.section(f"runtime-core provider kit: {kit.name}")
        for line in kit.summary().splitlines()[1:]:
            terminalreporter.write_line(line)
