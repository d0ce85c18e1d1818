"""``ppoflow.plugins``: modules imported before the registry names are validated, in the driver and
in every rank process, and their source files (for the stage cache keys)."""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from stages.algos.advantages import ADV_ESTIMATORS
from stages.algos.policy_loss_config import POLICY_LOSSES
from stages.config import ConfigError, load_config
from stages.plugins import import_plugins, plugin_roots, plugin_source_files

ESTIMATOR_PLUGIN = '''
"""A test plugin: an estimator whose advantages are 7 on every response token."""
import torch

from stages.algos.advantages import register_adv_est
from stages.algos.policy_loss_config import register_policy_loss
from stages.algos.policy_losses import compute_policy_loss_vanilla


@register_adv_est("{name}", group_based=True)
def sevens(token_level_rewards, response_mask, *, index=None, config=None, **kwargs):
    advantages = torch.full_like(token_level_rewards, 7.0) * response_mask
    return advantages, advantages


register_policy_loss("{name}_loss")(compute_policy_loss_vanilla)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``write(source=ESTIMATOR_PLUGIN) -> (module, estimator)`` in tmp_path on sys.path; the
    module and what it registered are removed afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[tuple[str, str]] = []

    def write(source: str = ESTIMATOR_PLUGIN) -> tuple[str, str]:
        tag = uuid.uuid4().hex[:8]
        module, estimator = f"ppoflow_test_plugin_{tag}", f"sevens_{tag}"
        (tmp_path / f"{module}.py").write_text(source.format(name=estimator), encoding="utf-8")
        written.append((module, estimator))
        return module, estimator

    yield write
    for module, estimator in written:
        sys.modules.pop(module, None)
        for registry, name in ((ADV_ESTIMATORS, estimator), (POLICY_LOSSES, f"{estimator}_loss")):
            if name in registry:
                registry.remove(name)


def _yaml(path: Path, module: str, estimator: str, loss: str = "vanilla") -> Path:
    path.write_text(
        textwrap.dedent(f"""\
            ppoflow:
              plugins: [{module}]
            algorithm:
              adv_estimator: {estimator}
            actor_rollout_ref:
              rollout: {{n: 2}}
              actor:
                policy_loss: {{loss_mode: {loss}}}
            """),
        encoding="utf-8",
    )
    return path


def test_a_plugin_estimator_and_loss_are_selectable_from_yaml(plugin, tmp_path) -> None:
    module, estimator = plugin()
    with pytest.raises(ConfigError, match=rf"adv_estimator: got '{estimator}'"):
        load_config(None, [f"algorithm.adv_estimator={estimator}"])  # not imported yet
    cfg = load_config(_yaml(tmp_path / "run.yaml", module, estimator, f"{estimator}_loss"))
    assert cfg.ppoflow.plugins == [module]
    assert cfg.algorithm.adv_estimator == estimator
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == f"{estimator}_loss"
    assert ADV_ESTIMATORS.get(estimator).group_based  # its declared needs reach the checks
    assert not cfg.derived.use_critic


def test_validation_errors_list_the_plugin_estimator(plugin, tmp_path) -> None:
    module, estimator = plugin()
    with pytest.raises(ConfigError) as info:
        load_config(_yaml(tmp_path / "typo.yaml", module, estimator + "s"))
    (problem,) = info.value.problems
    assert problem.startswith(
        f"algorithm.adv_estimator: got '{estimator}s'; did you mean '{estimator}'?"
    )
    assert "'gae'" in problem and "'grpo'" in problem


def test_a_plugin_that_cannot_be_imported_is_one_line_naming_the_key(plugin, tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["ppoflow.plugins=[no_such_ppoflow_plugin]"])
    assert info.value.problems == [
        "ppoflow.plugins[0]: cannot import module 'no_such_ppoflow_plugin': "
        "ModuleNotFoundError: No module named 'no_such_ppoflow_plugin'"
    ]
    module, _ = plugin("raise RuntimeError('boom\\nsecond line')\n")
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"ppoflow.plugins=[json, {module}]"])
    assert info.value.problems == [
        f"ppoflow.plugins[1]: cannot import module '{module}': RuntimeError: boom second line"
    ]


def test_plugin_names_must_be_module_names() -> None:
    with pytest.raises(ImportError, match=r"ppoflow.plugins\[0\]: got 'my-plugin.py'; expected"):
        import_plugins(["my-plugin.py"])
    with pytest.raises(ConfigError, match=r"ppoflow.plugins\[0\]: got '5'; expected"):
        load_config(None, ["ppoflow.plugins=[5]"])


def test_plugins_default_to_none() -> None:
    assert load_config(None).ppoflow.plugins == []


def test_source_files_of_a_module_and_of_a_package(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    tag = uuid.uuid4().hex[:8]
    (tmp_path / f"single_{tag}.py").write_text("X = 1\n")
    package = tmp_path / f"pack_{tag}"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py"):
        (package / name).write_text("")
    (package / "data.txt").write_text("not source")
    try:
        assert plugin_source_files([f"single_{tag}"]) == [(tmp_path / f"single_{tag}.py").resolve()]
        files = plugin_source_files([f"pack_{tag}"])
        assert [p.relative_to(package.resolve()).as_posix() for p in files] == [
            "__init__.py",
            "a.py",
            "sub/__init__.py",
            "sub/b.py",
        ]
        assert plugin_source_files([f"pack_{tag}.sub.b"]) == [(package / "sub" / "b.py").resolve()]
        roots = plugin_roots([f"single_{tag}", f"pack_{tag}", f"pack_{tag}.sub"])
        assert roots == [str(tmp_path.resolve())]
        assert f"single_{tag}" not in sys.modules  # found without running the module
        with pytest.raises(ImportError, match=r"ppoflow.plugins\[0\]: cannot import module 'nope_"):
            plugin_source_files([f"nope_{tag}"])
    finally:
        for name in list(sys.modules):
            if name.startswith((f"single_{tag}", f"pack_{tag}")):
                del sys.modules[name]


def test_rank_processes_import_the_plugins_and_find_them(plugin, tmp_path, monkeypatch) -> None:
    import flows.engines as engines

    module, estimator = plugin()
    cfg = load_config(_yaml(tmp_path / "run.yaml", module, estimator))
    sys.modules.pop(module)  # a fresh rank process has not imported it
    ADV_ESTIMATORS.remove(estimator)
    POLICY_LOSSES.remove(f"{estimator}_loss")
    monkeypatch.setattr(engines, "new_worker", lambda role, config, steps: (role, steps))
    assert engines.build_rank_worker("actor", cfg, 3) == ("actor", 3)
    assert module in sys.modules and estimator in ADV_ESTIMATORS
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = engines._plugin_env(cfg)["env"]
    assert env["PYTHONPATH"].split(":") == [str(tmp_path.resolve()), "/elsewhere"]
    assert engines._plugin_env(load_config(None)) == {}
