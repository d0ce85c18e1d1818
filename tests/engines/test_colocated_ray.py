"""Colocated roles on the Ray backend (flows.engines.build_roles): the actor and the reference of
each of 2 ranks live in one Ray actor process — 2 processes, not 4 — and each role computes what
it computes alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows.engines import build_roles, close_engines
from stages.config import load_config

pytestmark = pytest.mark.slow
ray = pytest.importorskip(
    "ray", reason="the ray extra is not installed: pip install 'ppoflow[ray]'"
)

REPO = Path(__file__).resolve().parents[2]


def test_two_ranks_hold_the_actor_and_the_reference_in_one_process_each(
    tmp_path, make_rollout_batch
):
    from stages.data.tiny_model import make_tiny_model

    config = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={make_tiny_model(tmp_path / 'model')}",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "ppoflow.workers.backend=ray",
            "trainer.n_gpus_per_node=2",
        ],
    )
    batch = make_rollout_batch([3, 5, 2, 4], [4, 2, 3, 1], P=5, R=4)
    engines = build_roles(config, ["actor", "ref"], total_training_steps=1)
    try:
        actor, ref = engines["actor"], engines["ref"]
        group = actor._owner.group
        assert ref._owner.group is group and len(group._actors) == 2, "one process per rank"
        old = actor.call("compute_log_prob", batch).batch["old_log_probs"]
        ref_lp = ref.call("compute_ref_log_prob", batch).batch["ref_log_prob"]
        mask = batch.batch["response_mask"].bool()
        torch.testing.assert_close(ref_lp[mask], old[mask])  # the same initial weights
    finally:
        close_engines(engines)
    assert not ray.is_initialized(), "the group that started Ray shut it down with its last role"
