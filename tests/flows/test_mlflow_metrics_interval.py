"""``metrics_interval_s``: steps' metrics held and sent together, in the logger
(flows/sinks/mlflow_logger.py) and through the MLflow process, whose own clock sends them when
they are due (flows/sinks/mlflow_process.py); against a SQLite store in tmp."""

from __future__ import annotations

import os
import signal
import time

import pytest
from mlflow.tracking import MlflowClient

from flows.sinks.mlflow_logger import MLflowLogger
from flows.sinks.mlflow_process import MLflowProcessSink


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (creating one costs seconds of migrations)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def steps_of(uri: str, run_id: str, key: str = "a") -> list[int]:
    return sorted(point.step for point in MlflowClient(uri).get_metric_history(run_id, key))


class CountingClient:
    """The logger's client, counting its ``log_batch`` calls that carry metrics."""

    def __init__(self, client) -> None:
        self._client = client
        self.metric_batches: list[list[int]] = []

    def log_batch(self, run_id, metrics=(), **kwargs):
        if metrics:
            self.metric_batches.append(sorted({metric.step for metric in metrics}))
        return self._client.log_batch(run_id, metrics=metrics, **kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


def counting(logger: MLflowLogger) -> CountingClient:
    logger._client = CountingClient(logger._client)
    return logger._client


def test_steps_within_the_interval_go_in_one_batch_and_a_new_name_goes_at_once(tmp_path, store_uri):
    logger = MLflowLogger("proj", "held", run_dir=tmp_path, tracking_uri=store_uri,
                          metrics_interval_s=60.0)  # fmt: skip
    client = counting(logger)
    logger.log_metrics({"a": 1.0}, 1)  # a name not logged before: sent at once
    assert client.metric_batches == [[1]] and logger.held_calls == 0 and logger.settled
    logger.log_metrics({"a": 2.0}, 2)
    logger.log_metrics({"a": 3.0}, 3)
    assert logger.held_calls == 2 and not logger.settled
    assert logger.hold_deadline is not None
    assert steps_of(store_uri, logger.run_id) == [1]
    logger.log_metrics({"a": 4.0, "b": 1.0}, 4)  # "b" is new: everything held goes with it
    assert client.metric_batches == [[1], [2, 3, 4]]
    assert logger.held_calls == 0 and logger.hold_deadline is None and logger.settled
    logger.log_metrics({"a": 5.0, "b": 2.0}, 5)
    logger.close()
    assert client.metric_batches[-1] == [5]  # close sends what is held
    assert steps_of(store_uri, logger.run_id) == [1, 2, 3, 4, 5]


def test_held_steps_are_sent_when_due_and_before_any_other_call(tmp_path, store_uri):
    logger = MLflowLogger("proj", "due", run_dir=tmp_path, tracking_uri=store_uri,
                          metrics_interval_s=0.3)  # fmt: skip
    client = counting(logger)
    logger.log_metrics({"a": 1.0}, 1)
    logger.log_metrics({"a": 2.0}, 2)
    logger.send_held()  # the caller's clock: sent whether or not the interval has passed
    assert steps_of(store_uri, logger.run_id) == [1, 2] and logger.held_calls == 0
    logger.log_metrics({"a": 3.0}, 3)
    logger.set_tags({"x": "y"})  # another call sends the held steps first, in order
    assert steps_of(store_uri, logger.run_id) == [1, 2, 3] and logger.held_calls == 0
    logger.log_metrics({"a": 4.0}, 4)
    time.sleep(0.35)
    logger.log_metrics({"a": 5.0}, 5)  # the first held has waited the interval: both go now
    assert client.metric_batches[-1] == [4, 5] and logger.held_calls == 0
    logger.close()


def test_without_an_interval_every_step_is_sent_at_once(tmp_path, store_uri):
    logger = MLflowLogger("proj", "each", run_dir=tmp_path, tracking_uri=store_uri)
    client = counting(logger)
    for step in (1, 2, 3):
        logger.log_metrics({"a": float(step)}, step)
        assert logger.held_calls == 0 and logger.hold_deadline is None
    assert client.metric_batches == [[1], [2], [3]]
    logger.close()
    with pytest.raises(ValueError, match="metrics_interval_s must be >= 0, got -1"):
        MLflowLogger("proj", "bad", run_dir=tmp_path, tracking_uri=store_uri,
                     metrics_interval_s=-1)  # fmt: skip


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the held metrics never reached the store"
        time.sleep(0.05)


def sink_holding_two(tmp_path, store_uri: str, name: str, interval_s: float) -> MLflowProcessSink:
    """A process sink with ``interval_s`` that logged steps 1–3: step 1 sent (its names are
    new), steps 2–3 held."""
    sink = MLflowProcessSink.start("proj", name, run_dir=tmp_path, tracking_uri=store_uri,
                                   metrics_interval_s=interval_s)  # fmt: skip
    for step in (1, 2, 3):
        sink.log_metrics({"a": float(step)}, step)
    return sink


def test_the_process_sends_held_steps_when_due_without_another_call(tmp_path, store_uri):
    """The MLflow process holds steps 2–3, then sends them on its own once due; the sink keeps
    only the held calls for a replacement, never the ones the store has."""
    sink = sink_holding_two(tmp_path, store_uri, "timer", 0.5)
    try:
        assert len(sink._unsettled) == 2  # the held calls, kept for a replacement
        wait_for(lambda: steps_of(store_uri, sink.run_id) == [1, 2, 3])
        sink.log_metrics({"a": 4.0}, 4)
        assert len(sink._unsettled) == 1  # the reply says 2–3 reached the store
    finally:
        sink.close("FINISHED")
    assert steps_of(store_uri, sink.run_id) == [1, 2, 3, 4]
    assert MlflowClient(store_uri).get_run(sink.run_id).info.status == "FINISHED"


def test_steps_held_by_a_process_that_dies_are_sent_by_its_replacement(tmp_path, store_uri):
    sink = sink_holding_two(tmp_path, store_uri, "dies", 600.0)
    try:
        run_id = sink.run_id
        assert steps_of(store_uri, run_id) == [1]
        os.kill(sink.pid, signal.SIGKILL)
        sink.log_metrics({"a": 4.0}, 4)
        assert sink.restarts == 1
    finally:
        sink.close("FINISHED")
    assert steps_of(store_uri, run_id) == [1, 2, 3, 4]
