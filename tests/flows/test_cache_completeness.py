"""Cache keys that see code and files, weight writers that always run, self-contained run dirs.

The toy step of tests/flows/conftest.py plus a stage that reads a user file named in the config
(``toy.path``, a ``file_keys`` entry) and one that writes weights.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dataproto import DataProto
from dataproto.artifact import ArtifactError, save_artifact
from flows.cache.code_fingerprint import (
    _closure,
    changed_files,
    code_files,
    function_module,
    package_modules,
    stage_code,
    stage_modules,
)
from flows.cache.keys import stage_key_parts
from flows.cache.miss_reasons import miss_reasons
from flows.cache.user_files import path_digest
from flows.rerun import load_step_input
from flows.runs.store import RunStore, StepJournal
from flows.step_flow import WEIGHT_WRITER_REASON, run_step
from stages.ppo import PPO_STAGES
from stages.stage import Stage, StageContext, tensor

pytestmark = pytest.mark.usefixtures("prefect_harness")

STAGES = {stage.name: stage for stage in PPO_STAGES}


def file_stages(calls: Counter) -> list[Stage]:
    """read: y = x + the number in the file at toy.path; update: writes 'weights' (counts)."""

    def read(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["read"] += 1
        number = float(Path(ctx.config["toy"]["path"]).read_text())
        return DataProto.from_dict({"y": batch.batch["x"] + number})

    def update(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["update"] += 1
        ctx.engines["model"]["steps"] += 1
        return DataProto.from_dict({"g": batch.batch["y"] * 0})

    return [
        Stage("read", 1, (tensor("x"),), (tensor("y"),), read, file_keys=("toy.path",)),
        Stage(
            "update",
            1,
            (tensor("y"),),
            (tensor("g"),),
            update,
            reads_weights=True,
            writes_weights=True,
            engine="model",
        ),
    ]


@pytest.fixture
def batch() -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(6, dtype=torch.float32).reshape(2, 3)},
        {"uid": np.array(["a", "b"], dtype=object)},
    )


@pytest.fixture
def setup(tmp_path) -> tuple[Counter, list[Stage], Path]:
    """(calls per stage, the file stages, a score file holding 1)."""
    calls = Counter()
    score = tmp_path / "score.txt"
    score.write_text("1")
    return calls, file_stages(calls), score


def run(stages, batch, score: Path, store: RunStore, **kwargs):
    ctx = StageContext(config={"toy": {"path": str(score)}}, engines={"model": {"steps": 0}})
    return run_step(
        stages, batch, ctx, store, 1, weights_fingerprints={"update": "w" * 64}, **kwargs
    )


def by_stage(result) -> dict[str, tuple[str, str]]:
    return {record.stage: (record.status, record.reason) for record in result.records}


# --- user files ---------------------------------------------------------------------------------


def test_an_edited_user_file_is_a_miss_naming_the_file_and_a_copy_is_a_hit(tmp_path, batch, setup):
    calls, stages, score = setup
    store = RunStore(tmp_path / "run")
    first = run(stages, batch, score, store)
    assert by_stage(first)["read"] == ("ran", "cache miss")
    score.write_text("5")  # edited in place: same path, other content
    second = run(stages, batch, score, store)
    status, reason = by_stage(second)["read"]
    assert status == "ran" and reason == "cache miss: file changed (toy.path)"
    assert torch.equal(second.batch.batch["y"], batch.batch["x"] + 5)  # not the stale 1
    copy = tmp_path / "elsewhere" / "score.txt"
    copy.parent.mkdir()
    copy.write_text("5")
    third = run(stages, batch, copy, store)
    assert by_stage(third)["read"] == ("cached", "cache hit")  # keyed by content, not by path
    assert calls["read"] == 2


def test_path_digest_covers_every_file_of_a_directory(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    before = path_digest(tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    added = path_digest(tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").write_text('{"a": 1}')
    edited = path_digest(tmp_path / "m")
    assert len({before, added, edited}) == 3 and before.startswith("blake3:")
    shutil.copytree(tmp_path / "m", tmp_path / "copy")
    assert path_digest(tmp_path / "copy") == edited


def test_ppo_stages_key_the_files_they_read():
    assert "reward.custom_reward_function.path" in STAGES["reward"].file_keys
    assert "reward.reward_model.model_path" in STAGES["reward"].file_keys
    assert "actor_rollout_ref.model.tokenizer_path" in STAGES["rollout"].file_keys
    assert STAGES["baseline_reward"].file_keys == STAGES["reward"].file_keys
    assert STAGES["rollout"].seeded and not STAGES["baseline_rollout"].seeded  # greedy


# --- weight writers -----------------------------------------------------------------------------


def test_a_weight_writing_stage_runs_again_in_training_but_not_in_a_rerun(tmp_path, batch, setup):
    calls, stages, score = setup
    store = RunStore(tmp_path / "run")
    run(stages, batch, score, store, run_weight_writers=True)
    again = run(stages, batch, score, store, run_weight_writers=True)
    assert by_stage(again) == {
        "read": ("cached", "cache hit"),
        "update": ("ran", WEIGHT_WRITER_REASON),
    }
    assert calls["update"] == 2  # the optimizer step happened twice
    branch = run(stages, batch, score, store)  # a re-run branch: the weights end with the step
    assert by_stage(branch)["update"] == ("cached", "cache hit") and calls["update"] == 2


# --- code ---------------------------------------------------------------------------------------


def test_a_stage_closure_holds_its_math_and_engines_only_where_it_uses_them():
    advantage = stage_code(STAGES["advantage"]).files
    rollout = stage_code(STAGES["rollout"]).files
    reward = stage_code(STAGES["reward"]).files
    assert "stages/algos/advantages_group.py" in advantage
    assert "stages/engines/actor.py" not in advantage and "stages/reward/loop.py" not in advantage
    assert {"stages/engines/actor.py", "stages/engines/rollout_hf.py"} <= set(rollout)
    assert "stages/reward/scorers/gsm8k.py" in reward and "stages/reward/loop.py" in reward
    assert "stages/__init__.py" in advantage and "dataproto/protocol.py" in advantage
    assert not any(name.startswith("flows/") for name in {*advantage, *rollout, *reward})


def test_the_closure_follows_lazy_imports_module_name_strings_and_parent_packages(
    tmp_path, monkeypatch
):
    package = tmp_path / "fakepkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import helper\n")
    (package / "sub" / "helper.py").write_text("X = 1\n")
    (package / "table.py").write_text("")
    (package / "lazy.py").write_text("def f():\n    from fakepkg import table\n")
    (package / "named.py").write_text("")
    (package / "unused.py").write_text("")
    (package / "stage.py").write_text(
        "import fakepkg.sub\nMODS = {'n': 'fakepkg.named'}\n"
        "def g():\n    from fakepkg import lazy\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    names = {name for name, _ in _closure(("fakepkg.stage",), ("fakepkg",))}
    assert names == {
        "fakepkg",
        "fakepkg.stage",
        "fakepkg.sub",
        "fakepkg.sub.helper",
        "fakepkg.lazy",
        "fakepkg.table",
        "fakepkg.named",
    }
    assert "fakepkg.unused" in package_modules("fakepkg")


def test_an_edited_source_file_changes_the_fingerprint_of_the_stages_that_import_it():
    starts = stage_modules("stages.advantage", uses_engines=False)
    files = code_files(starts)
    edited = {**files, "stages/algos/advantages_group.py": "0" * 64}
    assert changed_files(files, edited) == ["stages/algos/advantages_group.py"]
    reasons = miss_reasons(
        {"format": "f", "code": "old"},
        {"format": "f", "code": "new"},
        {"old": files, "new": edited}.get,
    )
    assert reasons == ["stage code changed (stages/algos/advantages_group.py)"]


def test_function_module_sees_through_partials():
    import functools

    assert function_module(functools.partial(path_digest)) == "flows.cache.user_files"


def test_key_parts_name_every_input_of_the_key():
    stage = STAGES["rollout"]
    tree: dict = {"trainer": {"seed": 7}}
    for path in (*stage.config_keys, *stage.file_keys):
        *parents, leaf = path.split(".")
        node = tree
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = None if path in stage.file_keys else 1
    tree["actor_rollout_ref"]["rollout"]["multi_turn"]["enable"] = False  # single-turn: no tools
    tree["actor_rollout_ref"]["rollout"]["agent"]["default_agent_loop"] = "single_turn_agent"
    tree["reward"] = {"score_in_rollout": False, "reward_model": {"enable": False}}

    def namespace(node):
        return (
            SimpleNamespace(**{k: namespace(v) for k, v in node.items()})
            if isinstance(node, dict)
            else node
        )

    config = namespace(tree)
    fingerprints = {key: "f" * 64 for key in stage.requires}
    parts = stage_key_parts(stage, config, fingerprints, "w" * 64, step=3)
    assert set(parts) == {
        "format", "stage", "version", "code", "config", "files", "inputs", "weights", "seed",
        "optional",
    }  # fmt: skip
    assert parts["optional"] == {}  # none of the optional keys is in this input
    assert parts["seed"] == {"seed": 7, "step": 3}
    assert parts["files"] == {  # each file's digest (None: unset)
        "actor_rollout_ref.model.tokenizer_path": None,
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": None,
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path": None,
    }
    later = stage_key_parts(stage, config, fingerprints, "w" * 64, step=4)
    assert miss_reasons(parts, later, lambda _: None) == [
        'sampling seed {"seed": 7, "step": 3} → {"seed": 7, "step": 4}'
    ]


# --- run directories ----------------------------------------------------------------------------


def test_a_copied_run_directory_is_self_contained(tmp_path, batch, setup):
    calls, stages, score = setup
    original = RunStore(tmp_path / "run")
    run(stages, batch, score, original)
    journal = json.loads((tmp_path / "run" / "step_1" / "journal.json").read_text())
    assert journal["input_artifact"] == "step_1/input"
    assert [s["artifact"] for s in journal["stages"]] == ["step_1/read", "step_1/update"]
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    shutil.rmtree(tmp_path / "run")  # the copy must not need the original
    copy = RunStore(tmp_path / "copy")
    assert copy.read_journal(1).record("read").artifact == f"{copy.root}/step_1/read"
    again = run(stages, batch, score, copy)
    assert by_stage(again) == {"read": ("cached", "cache hit"), "update": ("cached", "cache hit")}
    assert again.records[0].artifact == f"{copy.root}/step_1/read"
    assert calls == Counter(read=1, update=1)


def test_a_step_input_that_is_not_the_journals_is_refused_naming_the_file(tmp_path, batch):
    store = RunStore(tmp_path / "run")
    one = save_artifact(batch, store.input_path(1), stage="input")
    other = batch.select_idxs(np.array([1, 0]))
    save_artifact(other, store.input_path(2), stage="input")
    journal = StepJournal(2, input_artifact=store.input_path(2), input_fingerprint=one.fingerprint)
    with pytest.raises(ArtifactError, match=r"step_2/input: holds fingerprint .* step 2's input"):
        load_step_input(journal, "the run", "full")
    journal.input_artifact = store.input_path(1)
    assert len(load_step_input(journal, "the run", "full")) == 2
