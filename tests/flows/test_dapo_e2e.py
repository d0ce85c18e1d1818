"""End to end: DAPO's dynamic sampling in the train flow on the tiny model and the demo prompts.

The recipe config (configs/dapo-cpu.yaml) at the tiny size: 4 prompt groups per step, rounds of
6 prompts × n 2, 8 response tokens (overlong buffer 4), scored by :data:`SCORER`, whose score
depends on the response's length only, so about half the groups have zero spread. Checked from
the run's artifacts: every round is its own stage run (``step_<k>/round_<r>/``: input, rollout,
reward, journal); the step trains on exactly the first 4 kept groups, each with non-zero spread;
the counts and signal metrics; the loader's position counts every round drawn; one round's
reward stage re-runs from the round's own input. Bad input: a filter metric no scorer returns
stops the run at step 1's first round, and a round limit never met ends it with one line naming
the key, before any update.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataproto.artifact import load_artifact
from flows.gen_rounds import EVICTED, GENERATED, SURPLUS, RoundLimitError, RoundStore
from flows.rerun import rerun
from flows.runs.store import RunStore
from flows.train import train
from stages.algos.filter_groups import group_spread
from stages.filter_metrics import FilterMetricError
from stages.metrics.signal import GEN_ROUNDS, ZERO_ADV, ZERO_SPREAD

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "dapo-cpu.yaml"
TRAIN, GEN, N = 4, 6, 2
#: the score depends on the length only: 1 for an even number of characters, else 0
SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    even = float(len(solution_str) % 2 == 0)
    return {"score": even, "acc": even}
"""
#: every response the same score: no group has spread
FLAT_SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0
"""


def dapo_overrides(tiny_run_overrides, demo: Path, out: Path, steps: int, scorer: str, *extra):
    path = out / "scorer.py"
    path.write_text(scorer, encoding="utf-8")
    return tiny_run_overrides(
        demo,
        out,
        steps,
        f"data.gen_batch_size={GEN}",
        f"reward.custom_reward_function.path={path}",
        "trainer.val_before_train=false",
        *extra,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory, make_demo_inputs) -> Path:
    return make_demo_inputs(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def dapo_run(demo, tmp_path_factory, tiny_run_overrides):
    out = tmp_path_factory.mktemp("dapo")
    overrides = dapo_overrides(tiny_run_overrides, demo, out, 2, SCORER)
    return out, train(CONFIG, overrides, str(out / "run"))


def rounds_of(store: RunStore, step: int) -> list[int]:
    return sorted(
        int(p.name.removeprefix("round_")) for p in Path(store.step_dir(step)).glob("round_*")
    )


def test_each_round_is_a_stage_run_and_the_step_trains_on_the_first_kept_groups(dapo_run):
    out, result = dapo_run
    store = RunStore(result.run_dir)
    total_rounds = 0
    for step, metrics in zip((1, 2), result.history):
        rounds = rounds_of(store, step)
        assert rounds == list(range(1, len(rounds) + 1)) and metrics[GEN_ROUNDS] == len(rounds)
        total_rounds += len(rounds)
        kept_uids, evicted = [], 0
        for r in rounds:
            view = RoundStore(store, r)
            journal = view.read_journal(step)
            assert journal.status == "done" and journal.weights  # a re-run needs the weights
            assert [rec.stage for rec in journal.stages if rec.status == "ran"] == [
                "rollout",
                "reward",
            ]
            batch = load_artifact(journal.input_artifact)
            assert len(batch) == GEN * N
            scores = load_artifact(view.artifact_path(step, "reward")).batch["seq_scores"]
            uid = batch.non_tensor_batch["uid"]
            std, _ = group_spread(uid, scores.numpy())
            groups = list(dict.fromkeys(uid))
            kept_uids += [g for g, s in zip(groups, std) if s > 0]
            evicted += int((std == 0).sum()) * N
        journal = store.read_journal(step)
        assert "rollout" not in [rec.stage for rec in journal.stages]  # the rounds generated
        step_input = load_artifact(journal.input_artifact)
        assert len(step_input) == TRAIN * N
        uid = step_input.non_tensor_batch["uid"]
        assert list(dict.fromkeys(uid)) == kept_uids[:TRAIN]  # the first kept, in order
        std, _ = group_spread(uid, step_input.batch["seq_scores"].numpy())
        assert (std > 0).all()
        assert metrics[GENERATED] == len(rounds) * GEN * N and metrics[EVICTED] == evicted
        assert metrics[SURPLUS] == (len(kept_uids) - TRAIN) * N
        assert metrics[ZERO_SPREAD] == 0.0  # the filter left no zero-spread group
        assert 0.0 <= metrics[ZERO_ADV] < 1.0
    state = json.loads((out / "checkpoints" / "global_step_2" / "data" / "state.json").read_text())[
        "loader"
    ]
    per_epoch = 32 // GEN  # the demo inputs' 32 training prompts
    assert state["batch_size"] == GEN
    assert state["epoch"] * per_epoch + state["batch_index"] == total_rounds  # every round drawn


def test_one_rounds_reward_stage_re_runs_from_the_rounds_input(dapo_run, tmp_path):
    _, result = dapo_run
    branch = rerun(
        result.run_dir, 1, "reward", None, ["reward.overlong_buffer.penalty_factor=0.5"],
        str(tmp_path / "branch"), gen_round=1,
    )  # fmt: skip
    records = {rec.stage: rec for rec in branch.records}
    assert records["rollout"].status == "cached" and "reused from" in records["rollout"].reason
    assert records["reward"].status == "ran"
    assert (tmp_path / "branch" / "step_1" / "round_1" / "reward" / "manifest.json").is_file()
    assert branch.engines_built == ["reward_loop"]  # no model: the rollout was reused


def test_a_filter_metric_no_scorer_returns_stops_at_the_first_round(
    demo, tmp_path, tiny_run_overrides
):
    overrides = dapo_overrides(
        tiny_run_overrides, demo, tmp_path, 2, SCORER, "algorithm.filter_groups.metric=nope"
    )
    with pytest.raises(FilterMetricError, match=r"metric = 'nope': no scorer returned it .*'acc'"):
        train(CONFIG, overrides, str(tmp_path / "run"))
    store = RunStore(str(tmp_path / "run"))
    assert rounds_of(store, 1) == [1] and not Path(store.artifact_path(1, "update_actor")).exists()


def test_a_round_limit_never_met_ends_the_run_naming_it(demo, tmp_path, tiny_run_overrides):
    overrides = dapo_overrides(
        tiny_run_overrides, demo, tmp_path, 2, FLAT_SCORER,
        "algorithm.filter_groups.max_num_gen_batches=2",
    )  # fmt: skip
    with pytest.raises(RoundLimitError) as info:
        train(CONFIG, overrides, str(tmp_path / "run"))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(
        "step 1: algorithm.filter_groups.max_num_gen_batches = 2 generation rounds kept 0 of the "
        "data.train_batch_size = 4 prompt groups needed"
    )
    store = RunStore(str(tmp_path / "run"))
    assert (
        rounds_of(store, 1) == [1, 2] and not Path(store.artifact_path(1, "update_actor")).exists()
    )


def test_a_step_without_signal_says_so_without_dynamic_sampling(
    demo, tmp_path, tiny_run_overrides, capsys
):
    overrides = dapo_overrides(
        tiny_run_overrides, demo, tmp_path, 1, FLAT_SCORER,
        "algorithm.filter_groups.enable=false", f"data.gen_batch_size={TRAIN}",
        "algorithm.filter_groups.max_num_gen_batches=0",
    )  # fmt: skip
    result = train(CONFIG, overrides, str(tmp_path / "run"))
    (metrics,) = result.history
    assert (metrics[GEN_ROUNDS], metrics[ZERO_SPREAD], metrics[ZERO_ADV]) == (1.0, 1.0, 1.0)
    lines = [line for line in capsys.readouterr().out.splitlines() if "learning signal" in line]
    assert lines == [
        "warning: health check no_learning_signal: step 1 has no learning signal: all 8 "
        "samples have advantage 0 (4 of 4 groups "
        "have zero reward spread); the policy gradient is zero"
    ]
