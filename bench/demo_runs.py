"""The demo trainings the benches start through the ``ppoflow`` command, one process per run:
the demo inputs, a training on them, its steps' metrics (``ppoflow inspect --json``), and a
failed command as one exit with the end of its output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PPOFLOW = Path(sys.executable).with_name("ppoflow")


def ppoflow(*args: str, env: dict[str, str]) -> str:
    """``ppoflow ARGS`` from the repository root; its stdout, or SystemExit with its output."""
    result = subprocess.run(
        [str(PPOFLOW), *args], cwd=REPO, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(
            f"ppoflow {args[0]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result.stdout


def make_demo(root: Path, env: dict[str, str]) -> None:
    """The demo task's parquet files (``root/data``) and the tiny model (``root/model``)."""
    ppoflow("make-demo-data", str(root / "data"), env=env)
    ppoflow("make-tiny-model", str(root / "model"), env=env)


def train_demo(
    root: Path, name: str, config: str, extra: list[str], env: dict[str, str]
) -> tuple[str, list[dict]]:
    """``ppoflow train CONFIG`` on :func:`make_demo`'s inputs into ``root/name``, no checkpoints,
    console only: (its console output, each step's metrics in step order)."""
    run_dir = root / name
    out = ppoflow(
        "train", config,
        f"data.train_files=[{root}/data/train.parquet]",
        f"data.val_files=[{root}/data/val.parquet]",
        f"actor_rollout_ref.model.path={root}/model",
        "trainer.save_freq=-1", "trainer.logger=[console]",
        f"trainer.default_local_dir={root}/{name}-checkpoints",
        f"ppoflow.artifact_dir={root}/store", *extra, "--run-dir", str(run_dir),
        env=env,
    )  # fmt: skip
    inspected = json.loads(ppoflow("inspect", str(run_dir), "--json", env=env))
    steps = sorted(inspected["steps"], key=lambda s: s["step"])
    return out, [step["metrics"] for step in steps]
