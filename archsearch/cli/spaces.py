"""``archsearch spaces``: list the built-in search spaces."""
from __future__ import annotations

HELP = "list the built-in search spaces"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    from rich.table import Table

    import search_spaces
    from archsearch.cli._common import console
    from search_spaces.loader import BUILTIN_DIR
    from search_spaces.validate import objective_key

    table = Table(title=f"built-in search spaces (archsearch launch NAME; files in {BUILTIN_DIR})",
                  title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("description")
    table.add_column("objectives")
    table.add_column("trials", justify="right")
    for name in search_spaces.builtin_names():
        space = search_spaces.load(name)
        table.add_row(name, space.description,
                      ", ".join(objective_key(o, space.task.name) for o in space.objectives), str(space.study.trials))
    console().print(table)
    return 0
