"""Metric sinks (``trainer.logger``): the registry's config checks, the fan-out's failure rule,
TensorBoard and offline W&B read back from what they wrote, and one tiny training run that logs
to every sink at once.

Hermetic: every directory is a tmp dir, W&B runs with ``WANDB_MODE=offline`` (or no mode and no
key, which ppoflow makes offline) and ``WANDB_DIR`` in tmp, so nothing reaches the network.
"""

from __future__ import annotations

import glob
import json
import math
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import stages.metrics.sinks as sinks_registry
from flows.sinks.contract import SinkDefaults
from flows.sinks.fanout import MetricSinks, import_factory, open_sinks
from stages.config import ConfigError, load_config
from stages.metrics.sinks import (
    METRIC_SINKS,
    MetricSinkSpec,
    is_installed,
    missing_package,
    shows_progress,
)

REPO = Path(__file__).resolve().parents[2]
# `make install` installs both extras; an install without them (the Docker test stage) skips
needs_wandb = pytest.mark.skipif(not is_installed("wandb"), reason="pip install 'ppoflow[wandb]'")
needs_tensorboard = pytest.mark.skipif(
    not is_installed("tensorboard"), reason="pip install 'ppoflow[tensorboard]'"
)
STEPS = [
    {"actor/pg_loss": 0.25, "critic/score/mean": 1.0, "val-core/demo/reward/mean@2": 0.5},
    {"actor/pg_loss": -0.125, "critic/score/mean": 2.0, "timing_s/gen": float("nan")},
]


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B with no mode and no key (so ppoflow's offline default applies), its files in tmp."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


# --- reading back what the sinks wrote ----------------------------------------------------------


def wandb_records(run_root: Path) -> Iterator[object]:
    """The records of the one W&B run under ``run_root/wandb`` (its ``run-<id>.wandb`` log).

    The file is W&B's transaction log: a 7-byte header (``:W&B``, magic, version), then
    LevelDB-log records (crc32 4 bytes, length 2, type 1: full / first / middle / last) in
    32 KiB blocks, each record payload a ``wandb_internal_pb2.Record``.
    """
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(str(run_root / "wandb" / "*run-*" / "run-*.wandb"))
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, payload, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # the writer is not done with this record yet
            return
        payload += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            payload = b""
            yield record


def wandb_history(run_root: Path) -> tuple[object, dict[int, dict[str, float]], int]:
    """(run record, {step: metrics as logged}, exit code) of the W&B run under ``run_root``.

    ``finish`` returns before W&B's service process has always written the file out, so this
    waits (up to 30 s) for the run's exit record.
    """
    deadline = time.monotonic() + 30
    records = list(wandb_records(run_root))
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, "the W&B run file has no exit record after 30 s"
        time.sleep(0.1)
        records = list(wandb_records(run_root))
    run, history, exit_code = None, {}, None
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            history[int(row.pop("_step"))] = {k: v for k, v in row.items() if k[0] != "_"}
        elif kind == "exit":
            exit_code = record.exit.exit_code
    return run, history, exit_code


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), …]} of the event files in ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


# --- config ------------------------------------------------------------------------------------


def test_logger_names_are_the_registry_names(monkeypatch):
    monkeypatch.setattr(sinks_registry, "is_installed", lambda package: True)
    cfg = load_config(None, ["trainer.logger=[console, mlflow, wandb, tensorboard]"])
    assert cfg.trainer.logger == ["console", "mlflow", "wandb", "tensorboard"]
    assert load_config(None, ["trainer.logger=tensorboard"]).trainer.logger == ["tensorboard"]
    assert set(METRIC_SINKS.names()) >= {"console", "mlflow", "wandb", "tensorboard"}


def test_unknown_logger_lists_the_known_ones():
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["trainer.logger=[console, wandbb]"])
    (problem,) = caught.value.problems
    assert problem.startswith("trainer.logger[1]: got 'wandbb'; did you mean 'wandb'?")
    assert "'console', 'mlflow', 'tensorboard' or 'wandb' (metric sink registry" in problem


def test_missing_package_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setattr(sinks_registry, "is_installed", lambda package: package != "wandb")
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["trainer.logger=[console, wandb, tensorboard]"])
    assert caught.value.problems == [
        "trainer.logger: 'wandb' needs the wandb package; install it with pip install "
        "'ppoflow[wandb]'"
    ]
    assert missing_package("tensorboard") is None and missing_package("console") is None
    load_config(None, ["trainer.logger=[console, mlflow]"])  # sinks without a package still load


def test_every_builtin_factory_imports_and_only_console_shows_progress():
    for name in METRIC_SINKS:
        spec = METRIC_SINKS.get(name)
        assert (spec.factory is None) == spec.shows_progress, name
        if spec.factory is not None:
            assert callable(import_factory(name, spec.factory)), name
    assert shows_progress(["console"]) and not shows_progress(["mlflow", "wandb", "tensorboard"])


# --- fan-out -----------------------------------------------------------------------------------


class Recorder(SinkDefaults):
    """Records its calls; raises on the steps in ``fail_at``."""

    def __init__(self, fail_at: tuple[int, ...] = ()) -> None:
        self.fail_at, self.steps, self.params, self.status = fail_at, [], [], None

    def log_params(self, config):
        self.params.append(config)

    def log_metrics(self, metrics, step):
        if step in self.fail_at:
            raise OSError(f"disk full at step {step}")
        self.steps.append((step, dict(metrics)))

    def close(self, status="FINISHED"):
        self.status = status


def test_every_sink_gets_the_same_calls():
    a, b = Recorder(), Recorder()
    sinks = MetricSinks({"a": a, "b": b}, run_dir=None)
    sinks.log_params({"trainer": {"seed": 1}})
    for step, metrics in enumerate(STEPS, start=1):
        sinks.log_metrics(metrics, step)
    sinks.close("FAILED")
    for sink in (a, b):
        assert sink.params == [{"trainer": {"seed": 1}}] and sink.status == "FAILED"
        assert [step for step, _ in sink.steps] == [1, 2]
    assert a.steps[0][1] == STEPS[0]


def test_a_failing_sink_is_retired_and_its_missed_steps_are_saved(tmp_path, caplog):
    healthy, broken = Recorder(), Recorder(fail_at=(2,))
    sinks = MetricSinks({"broken": broken, "healthy": healthy}, run_dir=str(tmp_path))
    for step in (1, 2, 3):
        sinks.log_metrics({"actor/pg_loss": float(step), "timing_s/gen": float("nan")}, step)
    sinks.close("FINISHED")
    assert [step for step, _ in healthy.steps] == [1, 2, 3]  # the others miss nothing
    assert [step for step, _ in broken.steps] == [1] and broken.status == "FINISHED"
    assert sinks.retired == {"broken": "OSError: disk full at step 2"}
    assert "metric sink 'broken' failed on step 2 and is retired" in caplog.text
    rows = [
        json.loads(line) for line in (tmp_path / "broken_pending.jsonl").read_text().splitlines()
    ]
    assert [(r["key"], r["value"], r["step"]) for r in rows] == [
        ("actor/pg_loss", 2.0, 2),
        ("timing_s/gen", "nan", 2),
        ("actor/pg_loss", 3.0, 3),
        ("timing_s/gen", "nan", 3),
    ]
    assert not (tmp_path / "healthy_pending.jsonl").exists()


def test_a_sink_failing_at_the_start_is_raised_and_the_opened_ones_are_closed(monkeypatch):
    opened = Recorder()

    class BadParams(Recorder):
        def log_params(self, config):
            raise ValueError("bad param")

    factories = {"first": lambda cfg, run_dir: opened, "second": lambda cfg, run_dir: BadParams()}
    for name in factories:
        METRIC_SINKS.add(name, MetricSinkSpec(factory=f"unused:{name}"))
    monkeypatch.setattr("flows.sinks.fanout.import_factory", lambda name, path: factories[name])
    try:
        cfg = load_config(None, ["trainer.logger=[console, first, second]"])
        with pytest.raises(ValueError, match="bad param"):
            open_sinks(cfg, run_dir=None)
    finally:
        for name in factories:
            METRIC_SINKS.remove(name)
    assert opened.status == "FAILED"


# --- TensorBoard -------------------------------------------------------------------------------


@needs_tensorboard
def test_tensorboard_scalars_read_back(tmp_path):
    from flows.sinks.tensorboard_logger import open_tensorboard_sink

    cfg = load_config(None, ["trainer.logger=[tensorboard]"])
    sink = open_tensorboard_sink(cfg, str(tmp_path))
    sink.log_params(cfg)
    for step, metrics in enumerate(STEPS, start=1):
        sink.log_metrics(metrics, step)
    sink.close("FINISHED")
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert set(scalars) == {name for metrics in STEPS for name in metrics}
    assert scalars["actor/pg_loss"] == [(1, 0.25), (2, -0.125)]
    assert scalars["val-core/demo/reward/mean@2"] == [(1, 0.5)]
    ((step, value),) = scalars["timing_s/gen"]
    assert step == 2 and math.isnan(value)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    (config_text,) = events.Tensors("config/text_summary")  # the config, once, at step 0
    text = config_text.tensor_proto.string_val[0].decode()
    assert config_text.step == 0 and json.loads(text)["trainer"]["logger"] == ["tensorboard"]


def test_tensorboard_needs_a_local_run_dir():
    from flows.sinks.tensorboard_logger import open_tensorboard_sink

    with pytest.raises(ValueError, match="not a local path"):
        open_tensorboard_sink(load_config(None, []), None)


# --- W&B ---------------------------------------------------------------------------------------


@needs_wandb
@pytest.mark.usefixtures("offline_wandb")
def test_wandb_offline_run_holds_the_metrics(tmp_path):
    from flows.sinks.wandb_logger import open_wandb_sink

    cfg = load_config(None, ["trainer.project_name=sinks", "trainer.experiment_name=offline"])
    sink = open_wandb_sink(cfg, str(tmp_path))
    sink.log_params(cfg)
    for step, metrics in enumerate(STEPS, start=1):
        sink.log_metrics(metrics, step)
    sink.close("FAILED")
    assert glob.glob(str(tmp_path / "wandb" / "offline-run-*"))  # offline without being asked
    run, history, exit_code = wandb_history(tmp_path)
    assert (run.project, run.display_name, run.run_id) == ("sinks", "offline", sink.run_id)
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["trainer"]["experiment_name"] == "offline" and config["algorithm"]
    assert sorted(history) == [1, 2]
    for step, metrics in enumerate(STEPS, start=1):
        assert set(history[step]) == set(metrics)
        assert all(same(history[step][k], v) for k, v in metrics.items()), step
    assert exit_code == 1  # close("FAILED")


def test_wandb_mode_respects_the_user():
    from flows.sinks.wandb_logger import WANDB_SETTINGS, wandb_mode

    assert wandb_mode({}) == "offline"
    assert wandb_mode({"WANDB_MODE": "disabled"}) is None
    assert wandb_mode({"WANDB_API_KEY": "key"}) is None
    assert WANDB_SETTINGS == {"console": "off", "x_disable_stats": True}


# --- all sinks in one training run ---------------------------------------------------------------


@pytest.mark.slow
@needs_wandb
@needs_tensorboard
@pytest.mark.usefixtures("prefect_harness", "offline_wandb")
def test_every_sink_of_a_tiny_run_holds_the_same_step_metrics(
    tmp_path, make_demo_inputs, tiny_run_overrides
):
    from mlflow.tracking import MlflowClient

    from flows.train import train
    from stages.metrics.naming import sanitize_metric_name

    demo = make_demo_inputs(tmp_path, n_train=8, n_val=4)
    overrides = tiny_run_overrides(
        demo,
        tmp_path,
        2,
        "trainer.logger=[console, mlflow, wandb, tensorboard]",
        "trainer.save_freq=0",
        "trainer.val_before_train=true",
    )
    run_dir = tmp_path / "run"
    result = train(REPO / "configs" / "demo-cpu.yaml", overrides, str(run_dir))
    before = {k: v for k, v in result.before_training.items() if k != "training/global_step"}
    logged = {0: before, **{i + 1: m for i, m in enumerate(result.history)}}
    assert sorted(logged) == [0, 1, 2] and "val-core" in "".join(logged[0])

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    _, wandb_steps, exit_code = wandb_history(run_dir)
    scalars = tensorboard_scalars(run_dir / "tensorboard")
    assert exit_code == 0 and sorted(wandb_steps) == [0, 1, 2]
    for step, metrics in logged.items():
        assert set(wandb_steps[step]) == set(metrics), step
        for name, value in metrics.items():
            mlflow_values = {
                m.step: m.value
                for m in client.get_metric_history(result.mlflow_run_id, sanitize_metric_name(name))
            }
            tensorboard_values = dict(scalars[name])
            assert same(mlflow_values[step], value), (name, step)
            assert same(wandb_steps[step][name], value), (name, step)
            assert same(tensorboard_values[step], float(np.float32(value))), (name, step)
    assert not list(run_dir.glob("*_pending.jsonl"))  # no sink was retired
