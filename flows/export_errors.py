"""The error of a bad ``ppoflow export`` or ``ppoflow validate`` request (``flows/export.py``,
``flows/export_lora.py``, ``flows/validate_run.py``): a ``ValueError``, so the commands print it as
one line with exit status 2."""

from __future__ import annotations


class ExportError(ValueError):
    """A bad export request: no such run or step, no base model, an output that is not empty, a
    base model other than the one a LoRA checkpoint was trained on."""


__all__ = ["ExportError"]
