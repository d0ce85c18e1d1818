"""End to end: 2 training steps with an advantage estimator from a ``ppoflow.plugins`` module,
selected by name in a YAML config; its distinctive advantages reach the advantage artifact."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dataproto.artifact import load_artifact
from flows.runs.store import RunStore
from flows.train import train
from stages.algos.advantages import ADV_ESTIMATORS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
MODULE, ESTIMATOR = "ppoflow_e2e_plugin", "e2e_constant"
ADVANTAGE = 0.37  # on every response token: no built-in estimator gives it
PLUGIN = f'''
import torch

from stages.algos.advantages import register_adv_est


@register_adv_est("{ESTIMATOR}", group_based=True)
def constant(token_level_rewards, response_mask, *, index=None, config=None, **kwargs):
    advantages = torch.full_like(token_level_rewards, {ADVANTAGE}) * response_mask
    return advantages, advantages
'''


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(PLUGIN, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop(MODULE, None)
    if ESTIMATOR in ADV_ESTIMATORS:
        ADV_ESTIMATORS.remove(ESTIMATOR)


def test_two_steps_with_a_plugin_estimator_from_yaml(
    plugin_dir, tmp_path, make_demo_inputs, tiny_run_overrides
):
    demo = make_demo_inputs(tmp_path / "demo")
    config = tmp_path / "plugin.yaml"
    config.write_text(
        textwrap.dedent(f"""\
            base: {REPO / "configs" / "demo-cpu.yaml"}
            ppoflow:
              plugins: [{MODULE}]
            algorithm:
              adv_estimator: {ESTIMATOR}
            """),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    overrides = tiny_run_overrides(demo, out, 2, "trainer.val_before_train=false")
    result = train(config, overrides, str(out / "run"))
    assert result.steps == 2
    store = RunStore(result.run_dir)
    for step in (1, 2):
        assert store.read_journal(step).status == "done"
        advantages = load_artifact(store.artifact_path(step, "advantage")).batch["advantages"]
        response_mask = load_artifact(store.artifact_path(step, "rollout")).batch["response_mask"]
        is_plugin_value = torch.isclose(advantages, torch.tensor(ADVANTAGE))
        assert bool(((advantages == 0) | is_plugin_value).all())
        assert int(is_plugin_value.sum()) == int(response_mask.sum()) > 0
        assert torch.isfinite(torch.tensor(result.history[step - 1]["actor/pg_loss"]))


def test_an_edited_plugin_module_is_a_cache_miss_naming_it(
    plugin_dir, tmp_path, make_demo_inputs, tiny_run_overrides
):
    """One step with the plugin estimator; then the plugin file is edited and step 1 is re-run
    from the advantage in a new process (the one that imported the old plugin keeps running
    its old code): the advantage misses naming the plugin file, and uses the new code."""
    demo = make_demo_inputs(tmp_path / "demo")
    out = tmp_path / "out"
    overrides = tiny_run_overrides(
        demo,
        out,
        1,
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        f"ppoflow.plugins=[{MODULE}]",
        f"algorithm.adv_estimator={ESTIMATOR}",
    )
    result = train(REPO / "configs" / "demo-cpu.yaml", overrides, str(out / "run"))
    plugin = plugin_dir / f"{MODULE}.py"
    plugin.write_text(plugin.read_text().replace(str(ADVANTAGE), "0.5"), encoding="utf-8")
    branch = tmp_path / "branch"
    env = {**os.environ, "PYTHONPATH": str(plugin_dir), "PREFECT_HOME": str(tmp_path / "prefect")}
    command = [sys.executable, "-m", "flows.cli", "rerun", result.run_dir, "--step", "1",
               "--from", "advantage", "--to", "advantage", "--run-dir", str(branch)]  # fmt: skip
    completed = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=REPO, timeout=600
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    line = next(x for x in completed.stdout.splitlines() if x.strip().startswith("advantage"))
    assert "ran" in line and f"stage code changed (plugin:{plugin.resolve()})" in line, line
    advantages = load_artifact(RunStore(branch).artifact_path(1, "advantage")).batch["advantages"]
    assert bool(torch.isclose(advantages[advantages != 0], torch.tensor(0.5)).all())
