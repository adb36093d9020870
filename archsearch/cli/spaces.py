"""``archsearch spaces``: list the built-in search spaces."""
from __future__ import annotations

HELP = "list the built-in search spaces"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    import search_spaces
    from search_spaces.loader import builtin_path

    table = Table(title="built-in search spaces (archsearch launch NAME)", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("description")
    table.add_column("file", overflow="fold")
    for name in search_spaces.builtin_names():
        space = search_spaces.load(name)
        table.add_row(name, space.description, str(builtin_path(name)))
    Console().print(table)
    return 0
