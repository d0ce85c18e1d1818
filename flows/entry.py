"""The ``ppoflow`` executable: start what the command will wait for, then run the command line.

A training command (``train``, ``resume``) launches Prefect's temporary server before the
command line's modules import torch, transformers and Prefect (flows/prefect_server.py), so the
server comes up beside those imports instead of after them. Every other command goes straight to
the command line (flows/cli.py).
"""

from __future__ import annotations

import sys


def main() -> None:
    """``ppoflow …`` (pyproject's console script)."""
    from flows.prefect_server import start_ahead_for

    start_ahead_for(sys.argv[1:])
    from flows.cli import app

    app()


__all__ = ["main"]
