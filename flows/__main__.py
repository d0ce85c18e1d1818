"""``python -m flows …``: the ``ppoflow`` executable (flows/cli/entry.py)."""

from flows.cli.entry import main

main()
