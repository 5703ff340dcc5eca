"""Subcommands of the kit: ``runtime-core new-provider``."""

from __future__ import annotations

from pathlib import Path


def cmd_new_provider(args, out) -> int:
    """Write a provider package and say what to do next."""
    from .scaffold import new_provider, package_names

    cls = getattr(args, "class_name", None)
    written = new_provider(args.name, args.output, force=args.force, class_name=cls)
    names = package_names(args.name, cls)
    root = Path(args.output) if args.output else Path.cwd() / names["dist"]
    out.write(f"created {names['dist']} in {root} ({len(written)} files), provider class "
              f"{names['Class']}ExecutionProvider" + ("" if cls else " (--class-name chooses another)") + ":\n")
    for p in written:
        out.write(f"  {p.relative_to(root)}\n")
    from importlib import metadata

    from runtime_core.plugin import ENTRY_POINT_GROUP

    taken = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == args.name]
    if taken:
        out.write(f"\nnote: an installed plugin already uses the name {args.name!r} "
                  f"({taken[0].value}); rename one of them before installing\n")
    out.write("\nnext:\n"
              f"  pip install -e '{root}[test]'\n"
              f"  cd {root} && pytest           # its tests and the conformance kit\n"
              f"  runtime-core partition MODEL --providers {args.name},cpu\n")
    return 0


def register(subparsers) -> None:
    """Add ``new-provider`` to the ``runtime-core`` command line."""
    sp = subparsers.add_parser("new-provider", help="write a new execution provider package (a template)")
    sp.add_argument("name", help="the provider's short alias, e.g. 'acme' (the entry-point name)")
    sp.add_argument("--output", "-o", metavar="DIR",
                    help="folder of the package (default: ./runtime-provider-NAME); must be empty")
    sp.add_argument("--force", action="store_true", help="write into a non-empty folder, overwriting files")
    sp.add_argument("--class-name", metavar="CamelCase",
                    help="the provider class's name stem, e.g. OrtDelegate for OrtDelegateExecutionProvider "
                         "(default: from NAME, run-together known words split: ortdelegate -> OrtDelegate)")
    sp.set_defaults(fn=cmd_new_provider)
