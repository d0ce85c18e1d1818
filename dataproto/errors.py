"""Exceptions raised by DataProto operations.

verl signals most DataProto misuse with ``assert``, so verl code (and its tests) catch
``AssertionError``. ppoflow raises ordinary ``ValueError`` / ``TypeError`` / ``KeyError`` with a
message naming the key, layer and sizes involved, and each class below *also* derives from
``AssertionError``, so ``except AssertionError`` written against verl keeps catching them. The
checks are explicit ``raise`` statements, so ``python -O`` does not strip them.

>>> issubclass(DataProtoValueError, ValueError), issubclass(DataProtoValueError, AssertionError)
(True, True)
>>> str(DataProtoKeyError("key 'x' is not in batch"))
"key 'x' is not in batch"
"""

from __future__ import annotations


class DataProtoValueError(ValueError, AssertionError):
    """A value is wrong: sizes that disagree, a conflicting key, an impossible split."""


class DataProtoTypeError(TypeError, AssertionError):
    """An argument or a stored value has the wrong type."""


class DataProtoKeyError(KeyError, AssertionError):
    """A key is missing from (or already present in) a layer."""

    def __str__(self) -> str:
        # KeyError quotes its argument (repr); print the message as written instead.
        return str(self.args[0]) if self.args else ""


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages.

    >>> short_repr("x" * 100, limit=10)
    "'xxxxxx..."
    """
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
