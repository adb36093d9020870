"""``archsearch validate SPACE``: check a space, print its size and an example architecture."""
from __future__ import annotations

import sys

HELP = "check a search space (file or built-in name): every error, the size, an example spec"


def add_arguments(p) -> None:
    p.add_argument("space", metavar="SPACE", help="a YAML file or a built-in space name")


def run(args) -> int:
    import search_spaces
    from archsearch.errors import UserError
    from search_spaces.validate import objective_key

    try:
        space = search_spaces.load(args.space)
    except UserError as exc:
        # One line per problem, each naming its YAML path (exit 2 like any user error).
        lines = str(exc).splitlines()
        for line in lines:  # file-level errors (missing, not YAML) already start with the path
            print(line if line.startswith(f"{args.space}: ") else f"{args.space}: {line}", file=sys.stderr)
        print(f"archsearch validate: {len(lines)} error{'s' * (len(lines) != 1)}", file=sys.stderr)
        return 2
    text, _ = search_spaces.size(space)
    spec = search_spaces.example(space)
    spec.validate()
    print(f"{args.space}: ok")
    print(f"space: {space.name}  task: {space.task.name}  sampler: {space.sampler.name}  trials: {space.study.trials}")
    print("objectives: " + ", ".join(f"{objective_key(o, space.task.name)} ({o.direction})" for o in space.objectives))
    print(f"size: {text}")
    legend = ", ".join(f"{k}={v}" for k, v in spec.stack_legend().items())
    print(f"example: {spec.stack_string()}  ({legend})")
    print(spec.to_json(indent=2))
    return 0
