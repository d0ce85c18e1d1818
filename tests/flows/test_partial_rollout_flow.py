"""Partial rollouts (``async_training.partial_rollout``, flows/partial_rollout.py) in a real
training.

The tiny demo run (tests/conftest.py) for 6 steps, fully async (partial rollouts are the default,
as verl's) with ``staleness_threshold=0`` and ``trigger_parameter_sync_step=2`` (2 batches ahead, syncs at steps 1, 3, 5): batch 4, launched in
step 2, is interrupted by step 3's sync halfway through its R columns, batch 6 by step 5's.
Trained with the replica's jobs on their own thread and with each job run at once
(:class:`~flows.rollout_ahead.InlineLane`): the same weights bit for bit; every token tagged
with the weights that chose it; the rollout keyed by every segment's weights.
"""

from __future__ import annotations

import numpy as np
import pytest

from dataproto import keys as K
from dataproto.artifact import load_artifact
from flows.runs.store import RunStore
from stages.schedules import POLICY_VERSION, Pace, partial_cuts

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

STEPS = 6
PACE = Pace(depth=2, sync_every=2)
SCHEDULE = (
    "ppoflow.schedule=fully_async",
    "async_training.staleness_threshold=0",
    "async_training.trigger_parameter_sync_step=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "trainer.test_freq=-1",
)
#: step → (version of the columns before the cut, after it), for the batches a sync interrupts
INTERRUPTED = {4: (0, 2), 6: (2, 4)}


@pytest.fixture(scope="module")
def runs(schedule_runs):
    return schedule_runs(STEPS, *SCHEDULE)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, make_demo_inputs, runs):
    root = tmp_path_factory.mktemp("partial-rollout")
    return runs.overlapped_and_serial(root, make_demo_inputs(root / "demo"))


def test_the_overlapped_run_ends_with_the_serial_schedules_weights(two_runs, runs) -> None:
    runs.assert_same_weights(two_runs)


def test_each_token_is_tagged_with_the_weights_that_chose_it(two_runs) -> None:
    """Batches 4 and 6: their first R / 2 columns by the weights they were launched with, the rest
    by the sync's;
    the others by one version, with no token versions kept (not interrupted). The step input's
    policy_version is the first segment's."""
    (result, _), _ = two_runs
    store = RunStore(result.run_dir)
    for step in range(1, STEPS + 1):
        journal = store.read_journal(step)
        rollout = load_artifact(journal.record("rollout").artifact)
        inputs = load_artifact(journal.input_artifact)
        if step not in INTERRUPTED:
            assert K.ROLLOUT_POLICY_VERSIONS not in rollout.batch.keys(), step  # noqa: SIM118
            continue
        versions = rollout.batch[K.ROLLOUT_POLICY_VERSIONS]
        cut = versions.shape[1] // 2  # launched 2 steps ahead, the sync after the first
        assert partial_cuts(step, PACE, versions.shape[1]) == ((step - 1, cut),)
        before, after = INTERRUPTED[step]
        assert (versions[:, :cut] == before).all() and (versions[:, cut:] == after).all(), step
        assert np.array_equal(inputs.non_tensor_batch[POLICY_VERSION], [before] * len(inputs))


def test_the_rollout_is_keyed_by_every_segments_weights(two_runs) -> None:
    """An interrupted rollout's weights key part is neither segment's lineage alone."""
    (result, _), _ = two_runs
    store = RunStore(result.run_dir)
    journals = {step: store.read_journal(step) for step in range(1, STEPS + 1)}
    theta = {journal.weights["actor"] for journal in journals.values()}
    for step, journal in journals.items():
        weights = journal.record("rollout").key_parts["weights"]
        assert (weights in theta) == (step not in INTERRUPTED), step


def test_partial_metrics_count_the_samples_that_span_two_versions(two_runs) -> None:
    """fully_async/partial/*: the interrupted batches' rows that were still generating at the
    cut span 2 versions; the other steps have none."""
    (result, _), _ = two_runs
    for step, metrics in enumerate(result.history, 1):
        ratio, span = (
            metrics["fully_async/partial/partial_ratio"],
            metrics["fully_async/partial/max_partial_span"],
        )
        if step in INTERRUPTED:
            assert 0 < ratio <= 1 and span == 2, (step, metrics)
        else:
            assert ratio == 0 and span == 0, (step, metrics)


def test_a_rerun_reuses_a_partial_rollout_and_will_not_generate_it_again(
    two_runs, tmp_path
) -> None:
    """Re-running step 4 from its rollout reuses the run's (a cache hit on the segments' key);
    refreshed (``--refresh``) it would need every segment's weights: one ValueError saying so, and
    no branch left."""
    from flows.rerun import rerun

    (result, _), _ = two_runs
    same = rerun(result.run_dir, 4, "rollout", "rollout", new_run_dir=str(tmp_path / "same"))
    (record,) = [r for r in same.records if r.stage == "rollout"]
    assert (record.status, record.reason) == ("cached", "cache hit")
    with pytest.raises(ValueError, match="step 4's rollout was a partial rollout"):
        rerun(
            result.run_dir,
            4,
            "rollout",
            "rollout",
            new_run_dir=str(tmp_path / "again"),
            refresh=True,
        )
    assert not (tmp_path / "again").exists()
