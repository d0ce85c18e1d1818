"""Orchestration: the Prefect flows, the run store, the command line.

The flows themselves sit at the top (``train``, ``step_flow``, ``stage_task``, ``rerun``,
``validate``, ``export``); each concern has a room: ``cli/`` the command line, ``cache/`` stage
cache keys and records, ``runs/`` the run directory, ``sinks/`` metrics and reports, ``process/``
the process around a run. Importing the package changes nothing in the process; the ``ppoflow``
executable prepares its own (flows/process/own_process.py).
"""
