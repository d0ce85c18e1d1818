"""docs/bad-inputs.md's table lists every case of this suite, and only those (checked against
what this session collected under tests/bad_inputs: run with the whole directory).

The table is generated from the lines the commands printed:
``PPOFLOW_BAD_INPUTS_TABLE=1 .venv/bin/python -m pytest tests/bad_inputs -m ''`` rewrites it
(tests/bad_inputs/conftest.py).
"""

from __future__ import annotations

import os

import pytest

REGENERATE = "regenerate it: PPOFLOW_BAD_INPUTS_TABLE=1 pytest tests/bad_inputs -m ''"


def test_the_docs_table_lists_every_case(docs_table):
    if os.environ.get("PPOFLOW_BAD_INPUTS_TABLE") == "1":
        pytest.skip("this session rewrites the table when it ends")
    cases = {name for name in docs_table.collected if not name.startswith("test_table.py")}
    modules = {name.split("::")[0] for name in cases}
    missing = sorted(cases - set(docs_table.rows))
    assert not missing, f"not in docs/bad-inputs.md ({REGENERATE}): {missing}"
    stale = sorted(
        name for name in docs_table.rows if name.split("::")[0] in modules and name not in cases
    )
    assert not stale, f"docs/bad-inputs.md lists cases that no longer exist ({REGENERATE}): {stale}"


def test_every_row_is_one_error_line_with_its_exit_status(docs_table):
    assert len(docs_table.rows) >= 40
    for name, (described, line, code, _slow) in docs_table.rows.items():
        assert described and line.startswith("error: "), name
        assert code in (1, 2), name
