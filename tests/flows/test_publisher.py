"""flows.sinks.publisher: calls run in order on one background thread, errors surface, context carries."""

from __future__ import annotations

import contextvars
import threading

import pytest

from flows.sinks.publisher import Publisher

LABEL = contextvars.ContextVar("label", default="unset")


def test_calls_run_in_submission_order_off_the_calling_thread():
    seen: list[tuple[int, str]] = []
    publisher = Publisher()
    for i in range(5):
        publisher.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    publisher.close()
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    assert all(name.startswith("ppoflow-publish") for _, name in seen)


def test_an_error_surfaces_at_the_next_submit_and_close_raises_the_last():
    publisher = Publisher()
    publisher.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        publisher.submit(lambda: None)
    publisher.submit(lambda: [][1])
    with pytest.raises(IndexError):
        publisher.close()


def test_the_submitting_context_is_copied():
    got: list[str] = []
    publisher = Publisher()
    token = LABEL.set("step-3")
    try:
        publisher.submit(lambda: got.append(LABEL.get()))
    finally:
        LABEL.reset(token)
    publisher.wait()
    publisher.close()
    assert got == ["step-3"]
