"""``python -m flows …``: the ``ppoflow`` executable (flows/entry.py)."""

from flows.entry import main

main()
