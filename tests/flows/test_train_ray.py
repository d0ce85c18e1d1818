"""The train flow on the Ray worker backend (``ppoflow.workers.backend=ray``).

End to end (slow, ~1.5 min on 2 loaded CPU cores, most of it Ray and rank start-up): a 2-step GRPO
run with 2 data-parallel ranks (gloo, DeepSpeed on CPU) on the tiny model and the demo task. The
flow starts Ray, runs each step's stages on the actor group (rollout, log-probs and the update
split over the 2 ranks), validates with the group at the last step (5 prompts: one padded row),
checkpoints through every rank, and shuts Ray down when it closes the engines. The checkpoint's
weights load into the Hugging Face model and differ from the initial ones (the ranks trained).

Fast: the backend checks and the size of the Ray instance the flow starts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from flows.engines import check_backend, ray_init_options
from flows.runs.store import RunStore
from flows.train import train
from stages.config import load_config
from stages.metrics.naming import sanitize_metric_name

REPO = Path(__file__).resolve().parents[2]
STAGES_RUN = ["rollout", "balance", "reward", "old_log_prob", "advantage", "update_actor"]
STAGES_SKIPPED = ["ref_log_prob", "values", "update_critic"]


@pytest.fixture(scope="module")
def demo_inputs(tmp_path_factory, make_demo_inputs) -> Path:
    return make_demo_inputs(tmp_path_factory.mktemp("demo-ray"), n_train=16, n_val=5)


#: 4 prompts × n 2 = 8 sequences per step, 4 per rank; mini-batch 2 prompts × 2 = 2 per rank
RAY_RUN = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "ppoflow.workers.backend=ray",
    "trainer.n_gpus_per_node=2",
    "trainer.val_before_train=false",
)


def logged(tmp_path: Path, run_id: str, name: str) -> list[float]:
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    return [m.value for m in client.get_metric_history(run_id, sanitize_metric_name(name))]


def checkpoint_weights(actor_dir: Path) -> dict[str, torch.Tensor]:
    """The HF parameters in the checkpoint's DeepSpeed model file (ZeRO-0: rank 0 writes it)."""
    (model_file,) = (actor_dir / "state").glob("mp_rank_00_model_states.pt")
    module = torch.load(model_file, map_location="cpu", weights_only=False)["module"]
    return {name.removeprefix("lm."): tensor for name, tensor in module.items()}


def demo_config(*overrides: str):
    return load_config(REPO / "configs" / "demo-cpu.yaml", list(overrides))


def test_local_backend_refuses_several_ranks():
    config = demo_config(
        "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_mini_batch_size=16"
    )
    with pytest.raises(ValueError, match=r"set ppoflow\.workers\.backend=ray for 2 ranks"):
        check_backend(config)
    check_backend(demo_config())  # one local rank is fine


def test_vllm_rollouts_run_on_ray_ranks_one_engine_per_rank_or_spanning_ranks():
    config = demo_config(
        "ppoflow.workers.backend=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.name=vllm",
    )
    check_backend(
        config
    )  # every actor rank builds its own engine (tests/engines/test_vllm_on_ray.py)
    tp2 = demo_config(
        "ppoflow.workers.backend=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    )
    check_backend(tp2)  # one engine spans both ranks (external_launcher)


def test_ray_is_sized_for_every_role_group(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ranks = ("ppoflow.workers.backend=ray", "trainer.n_gpus_per_node=2")
    ref = ("actor_rollout_ref.actor.use_kl_loss=true",)
    critic = ("algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true")
    apart = ("ppoflow.workers.colocate=false",)
    assert ray_init_options(demo_config(*ranks), 0) == {"num_cpus": 2}  # actor
    # colocated (the default): every role of a rank in one process, on one device
    assert ray_init_options(demo_config(*ranks, *ref), 0) == {"num_cpus": 2}
    assert ray_init_options(demo_config(*ranks, *critic), 1) == {"num_cpus": 2, "num_gpus": 2}
    assert ray_init_options(demo_config(*ranks, *ref, *apart), 0) == {"num_cpus": 4}
    assert ray_init_options(demo_config(*ranks, *critic, *apart), 1) == {
        "num_cpus": 6,
        "num_gpus": 6,
    }
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert ray_init_options(demo_config(*ranks, *ref), 0) == {}  # a cluster brings its own


def test_the_gpu_count_is_that_of_the_role_groups(monkeypatch):
    from flows import engines

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(engines.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(engines.torch.cuda, "device_count", lambda: 2)
    kl = (
        "ppoflow.workers.backend=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
    )
    engines.check_gpu_count(demo_config(*kl))  # actor + ref on 2 GPUs
    with pytest.raises(
        ValueError,
        match=r"\(actor \| ref\) a GPU of its own: 4 GPUs, but this machine has 2; set ppoflow\.workers\.colocate=true",
    ):
        engines.check_gpu_count(demo_config(*kl, "ppoflow.workers.colocate=false"))


def test_colocate_false_needs_a_backend_with_processes_of_its_own():
    from stages.config import ConfigError

    with pytest.raises(ConfigError, match="the local backend runs every role in this process"):
        demo_config("ppoflow.workers.colocate=false")


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_grpo_two_steps_on_two_ray_ranks(demo_inputs, tmp_path, tiny_run_overrides):
    ray = pytest.importorskip(
        "ray", reason="the ray extra is not installed: pip install 'ppoflow[ray]'"
    )
    assert not ray.is_initialized()
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        tiny_run_overrides(demo_inputs, tmp_path, 2, *RAY_RUN),
        str(tmp_path / "run"),
    )
    assert not ray.is_initialized()  # the flow started Ray and shut it down with its engines

    assert result.steps == 2 and len(result.history) == 2
    store = RunStore(result.run_dir)
    for step in (1, 2):
        journal = store.read_journal(step)
        assert journal.status == "done"
        for stage in STAGES_RUN:
            assert (Path(store.artifact_path(step, stage)) / "manifest.json").is_file(), stage
            assert journal.record(stage).status == "ran", stage
        for stage in STAGES_SKIPPED:
            assert journal.record(stage).status == "skipped", stage
    for name in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "timing_s/gen"):
        values = logged(tmp_path, result.mlflow_run_id, name)
        assert len(values) == 2 and all(math.isfinite(v) for v in values), (name, values)
    assert result.val_after is not None and math.isfinite(result.val_after)

    actor_dir = tmp_path / "checkpoints" / "global_step_2" / "actor"
    manifest = json.loads((actor_dir / "ppoflow_checkpoint.json").read_text())
    assert manifest["world_size"] == 2
    assert {p.name for p in actor_dir.glob("rng_state_rank*.pt")} == {
        "rng_state_rank0.pt",
        "rng_state_rank1.pt",
    }
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(demo_inputs / "model")
    trained = AutoModelForCausalLM.from_pretrained(demo_inputs / "model")
    missing, unexpected = trained.load_state_dict(checkpoint_weights(actor_dir), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    changes = [
        (trained.state_dict()[name] - tensor).abs().max().item()
        for name, tensor in initial.state_dict().items()
    ]
    assert max(changes) > 0  # two updates moved the weights


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_grpo_with_a_kl_loss_on_colocated_ranks_ends_like_roles_apart(
    demo_inputs, tmp_path, tiny_run_overrides
):
    """2 ranks each holding the actor and the reference (2 processes, as on 2 GPUs) against the
    same run with each role on ranks of its own (4 processes): the same weights after 2 steps."""
    pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'ppoflow[ray]'")
    trained = {}
    for colocate in ("true", "false"):
        home = tmp_path / f"colocate-{colocate}"
        overrides = tiny_run_overrides(
            demo_inputs,
            home,
            2,
            *RAY_RUN,
            "actor_rollout_ref.actor.use_kl_loss=true",
            f"ppoflow.workers.colocate={colocate}",
        )
        result = train(REPO / "configs" / "demo-cpu.yaml", overrides, str(home / "run"))
        journal = RunStore(result.run_dir).read_journal(2)
        assert journal.record("ref_log_prob").status == "ran"
        kl = logged(home, result.mlflow_run_id, "actor/kl_loss")
        assert len(kl) == 2 and all(math.isfinite(v) for v in kl), kl
        trained[colocate] = checkpoint_weights(home / "checkpoints" / "global_step_2" / "actor")
    assert trained["true"].keys() == trained["false"].keys()
    for name, tensor in trained["false"].items():
        torch.testing.assert_close(trained["true"][name], tensor, msg=name)
