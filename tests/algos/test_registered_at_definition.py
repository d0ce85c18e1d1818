"""Every built-in registry entry of ``stages/algos`` is registered by a decorator on its function.

Searching the source for a name's registration finds it on the ``def`` it registers, never in a
table elsewhere: the syntax tree of ``stages/algos`` is read, and each registering decorator
(``@register_adv_est("gae", …)``, ``@register_group_estimator("grpo", …)``,
``@register_policy_loss(…)``, ``@register_kl_estimator(…)``, ``@register_kl_controller(…)``,
``@register_aggregation(…)``) is matched with the registry's entries.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from stages.algos.advantages import ADV_ESTIMATORS
from stages.algos.aggregation import AGG_LOSS_MODES
from stages.algos.kl import KL_ESTIMATORS
from stages.algos.kl_control import KL_CONTROLLERS
from stages.algos.policy_loss_config import POLICY_LOSSES

ALGOS = Path(__file__).resolve().parents[2] / "stages" / "algos"

#: registry -> the decorator names that register into it (a call's last dotted name)
DECORATORS = {
    "ADV_ESTIMATORS": {"register_adv_est", "register_group_estimator"},
    "POLICY_LOSSES": {"register_policy_loss"},
    "KL_ESTIMATORS": {"register_kl_estimator"},
    "KL_CONTROLLERS": {"register_kl_controller"},
    "AGG_LOSS_MODES": {"register_aggregation"},
}
REGISTRIES = {
    "ADV_ESTIMATORS": ADV_ESTIMATORS,
    "POLICY_LOSSES": POLICY_LOSSES,
    "KL_ESTIMATORS": KL_ESTIMATORS,
    "KL_CONTROLLERS": KL_CONTROLLERS,
    "AGG_LOSS_MODES": AGG_LOSS_MODES,
}
#: entries with no function to decorate: verl's exact KL is registered so the config can name it
#: and refuse it with the reason
WITHOUT_FUNCTION = {"KL_ESTIMATORS": {"full"}}

#: estimator name -> the registry function's name, as the entries have always been called
ESTIMATOR_FUNCTIONS = {
    "gae": "gae_advantages",
    "reinforce_plus_plus": "reinforce_plus_plus_advantages",
    "remax": "remax_advantages",
    "grpo": "grpo_advantages",
    "grpo_vectorized": "grpo_vectorized_advantages",
    "grpo_passk": "grpo_passk_advantages",
    "rloo": "rloo_advantages",
    "rloo_vectorized": "rloo_vectorized_advantages",
    "opo": "opo_advantages",
    "gpg": "gpg_advantages",
    "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline_advantages",
}


def _call_name(node: ast.expr) -> str:
    """``a.b.c`` → ``"a.b.c"``; ``name`` → ``"name"``."""
    if isinstance(node, ast.Attribute):
        return f"{_call_name(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def decorated_registrations(source: str) -> list[tuple[str, str, str]]:
    """``(decorator, registered name, function)`` for each registering decorator on a ``def``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            if not isinstance(decorator, ast.Call):
                continue
            for arg in decorator.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((_call_name(decorator.func), arg.value, node.name))
    return found


def registrations_in_algos() -> dict[str, dict[str, str]]:
    """Registry → {registered name: decorated function} over every module of ``stages/algos``."""
    by_registry: dict[str, dict[str, str]] = {registry: {} for registry in DECORATORS}
    for path in sorted(ALGOS.glob("*.py")):
        for decorator, name, function in decorated_registrations(path.read_text("utf-8")):
            for registry, decorators in DECORATORS.items():
                if decorator in decorators:
                    assert name not in by_registry[registry], f"{name} registered twice"
                    by_registry[registry][name] = function
    return by_registry


def builtin_entries(registry: str) -> set[str]:
    """The registry's names whose function is defined in ``stages.algos`` (a test or plugin may
    have registered others in this process)."""
    names = set()
    for name in REGISTRIES[registry].names():
        entry = REGISTRIES[registry].get(name)
        function = entry.fn
        if function is not None and function.__module__.startswith("stages.algos"):
            names.add(name)
    return names


@pytest.mark.parametrize("registry", sorted(REGISTRIES))
def test_each_builtin_entry_is_registered_on_its_definition(registry: str) -> None:
    decorated = set(registrations_in_algos()[registry])
    builtin = builtin_entries(registry)
    assert builtin, f"{registry} has no built-in entry: is the registry read at all?"
    assert not builtin & WITHOUT_FUNCTION.get(registry, set())
    assert builtin <= decorated, (
        f"{registry} entries registered away from their function: {sorted(builtin - decorated)}"
    )


def test_the_eleven_estimators_keep_their_names_and_functions() -> None:
    decorated = registrations_in_algos()["ADV_ESTIMATORS"]
    assert set(decorated) == set(ESTIMATOR_FUNCTIONS)
    for name, function in ESTIMATOR_FUNCTIONS.items():
        assert ADV_ESTIMATORS.get(name).fn.__name__ == function, name


def test_the_search_sees_decorators_only_on_functions() -> None:
    source = (
        "TABLE = [('grpo', f)]\n"
        "register_adv_est('late')(f)\n"
        "@register_adv_est('gae', needs_values=True)\n"
        "def gae_advantages(): ...\n"
        "@torch.no_grad()\n"
        "def plain(): ...\n"
        "@KL_CONTROLLERS.register('fixed')\n"
        "def fixed(): ...\n"
    )
    assert decorated_registrations(source) == [
        ("register_adv_est", "gae", "gae_advantages"),
        ("KL_CONTROLLERS.register", "fixed", "fixed"),
    ]
