"""The ``archsearch`` command. Each verb lives in its own module ``archsearch.cli.<verb>`` exposing
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``; the module is imported only
when its verb runs, so ``archsearch --help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# verb -> module under archsearch.cli (verbs with a dash map to an underscore module name)
VERBS = {
    "spaces": "spaces",
    "validate": "validate",
    "launch": "launch",
    "worker": "worker",
    "trial": "trial",
    "pareto": "pareto",
    "show": "show",
    "export": "export",
    "dashboard": "dashboard",
}


def _parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = argparse.ArgumentParser(
        prog="archsearch",
        description="Search hybrid linear/softmax architectures: define a space, launch a study, inspect the Pareto front.",
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    modules = {}
    for verb, modname in VERBS.items():
        try:
            mod = importlib.import_module(f"archsearch.cli.{modname}")
        except ModuleNotFoundError as exc:
            if exc.name == f"archsearch.cli.{modname}":
                continue  # verb not built yet
            raise
        p = sub.add_parser(verb, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        modules[verb] = mod
    return parser, modules


def _check_environment() -> None:
    """Environment settings the kernels read at import (deep inside a trial otherwise), checked up
    front so that a bad value is a one-line error."""
    from archsearch.errors import UserError
    from blocks.base import ConfigError
    from blocks.kernels import low_memory_from_env

    try:
        low_memory_from_env()
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    from archsearch.errors import UserError

    parser, modules = _parser()
    args = parser.parse_args(argv)
    if not args.verb:
        parser.print_help()
        return 2
    try:
        _check_environment()
        return int(modules[args.verb].run(args) or 0)
    except UserError as exc:
        print(f"archsearch {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"archsearch {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
