"""Hermetic test environment: no network, and every store (Prefect, MLflow, artifacts) in a temp dir.

The environment variables are set at import time of this file, before any test module imports
prefect or mlflow, because both read their settings on import.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="ppoflow-tests-"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HOME"] = str(_SESSION_TMP / "hf-home")
os.environ["PREFECT_HOME"] = str(_SESSION_TMP / "prefect-home")
os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = str(_SESSION_TMP / "prefect-results")
os.environ["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED"] = "false"
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_SESSION_TMP / 'mlflow.db'}"
# One OpenMP thread for the session's torch and every process it starts: on the 2-core machine
# the tiny models gain nothing from a second thread, and beside any other busy process two
# threads spin against each other (a demo step: 0.8 s with one, 3-9 s with two, measured)
os.environ["OMP_NUM_THREADS"] = "1"

from flows.process.own_process import prepare_own_process  # noqa: E402  (after the variables)

prepare_own_process()  # as the ppoflow executable prepares its own: telemetry off, service waits


def pytest_configure(config: pytest.Config) -> None:
    """torch in this process takes the one thread too, had anything imported it before."""
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu` tests on machines without CUDA (they are selected only with `-m gpu`)."""
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _tiny_run_overrides(demo: Path, out: Path, steps: int, *extra: str) -> list[str]:
    """Overrides of a tiny training run of configs/demo-cpu.yaml: the demo data and tiny model
    under ``demo`` (:func:`make_demo_inputs`), 4 prompts × n 2 with 8 response tokens, ``steps``
    steps with validation and a checkpoint at the last, checkpoints and MLflow under ``out``,
    one reward worker; ``extra`` overrides come last, so they win."""
    return [
        f"data.train_files=[{demo}/data/train.parquet]",
        f"data.val_files=[{demo}/data/val.parquet]",
        f"actor_rollout_ref.model.path={demo}/model",
        "data.train_batch_size=4",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        f"trainer.save_freq={steps}",
        f"trainer.default_local_dir={out}/checkpoints",
        f"ppoflow.mlflow_tracking_uri=sqlite:///{out}/mlflow.db",
        "reward.num_workers=1",
        *extra,
    ]


def _make_demo_inputs(root: Path, n_train: int = 32, n_val: int = 8) -> Path:
    """The demo task's parquet files (``root/data``) and the tiny model (``root/model``)."""
    from stages.data import make_demo_data, make_tiny_model

    make_demo_data(root / "data", n_train=n_train, n_val=n_val)
    make_tiny_model(root / "model")
    return root


@pytest.fixture(scope="session")
def tiny_run_overrides():
    """``f(demo, out, steps, *extra) -> list[str]``: a tiny training run's overrides."""
    return _tiny_run_overrides


@pytest.fixture(scope="session")
def make_demo_inputs():
    """``f(root, n_train=32, n_val=8) -> root``: writes the demo data and the tiny model."""
    return _make_demo_inputs


#: verl's gsm8k tool config (examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml),
#: byte for byte (its trailing space after ``config:`` included)
VERL_GSM8K_TOOL_CONFIG = """\
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:\x20
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed answer is incorrect or not correctly parsed)"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
"""


def _file_writer(text: str):
    """``f(path) -> path`` writing ``text`` at ``path`` (parents made)."""

    def write(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture(scope="session")
def write_verl_gsm8k_tool_config():
    """``f(path) -> path``: writes verl's gsm8k tool config, as verl ships it, at ``path``."""
    return _file_writer(VERL_GSM8K_TOOL_CONFIG)


#: a tool config with ppoflow's ``lookup`` tool (table a → alpha, b → beta): the agent tests' tool
LOOKUP_TOOL_CONFIG = """\
tools:
  - class_name: stages.agent.tools.lookup.LookupTool
    config: {type: native, table: {a: alpha, b: beta}}
    tool_schema:
      type: function
      function:
        name: lookup
        description: Look a key up.
        parameters: {type: object, properties: {key: {type: string, description: the key}}, required: [key]}
"""


@pytest.fixture(scope="session")
def write_lookup_tool_config():
    """``f(path) -> path``: writes the agent tests' lookup tool config at ``path``."""
    return _file_writer(LOOKUP_TOOL_CONFIG)


@pytest.fixture(scope="module")
def two_node_cluster():
    """A head and a worker node, 2 CPUs each (custom resources ``head_node`` / ``worker_node``),
    every process on loopback, Ray's files in a temp dir of their own. Yields the Cluster."""
    ray = pytest.importorskip(
        "ray", reason="the ray extra is not installed: pip install 'ppoflow[ray]'"
    )
    from ray.cluster_utils import Cluster

    from stages.engines.worker_group_ray import loopback_node

    saved = os.environ.get("RAY_TMPDIR")
    tmpdir = tempfile.mkdtemp(prefix="ray2n", dir="/tmp")  # short: Ray's socket paths
    os.environ["RAY_TMPDIR"] = tmpdir
    cluster = None
    try:
        with loopback_node(ray):
            cluster = Cluster()
            cluster.add_node(num_cpus=2, resources={"head_node": 1}, include_dashboard=False)
            cluster.add_node(num_cpus=2, resources={"worker_node": 1})
            cluster.wait_for_nodes()
            yield cluster
    finally:
        if cluster is not None:
            cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(tmpdir, ignore_errors=True)
