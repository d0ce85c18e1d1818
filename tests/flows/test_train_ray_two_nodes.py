"""The train flow on a Ray cluster of two nodes (``RAY_ADDRESS``, ``trainer.nnodes=2``).

Slow: a two-node ``ray.cluster_utils.Cluster`` on this machine (a head and a worker node, 2 CPUs
each, on loopback), then the same 2-step GRPO run of the demo task twice on it, 2 ranks (gloo,
DeepSpeed on CPU) each time, with HF rollouts, and with a vLLM (CPU build) engine per rank in
vLLM's environment (``make test-vllm``): ``trainer.nnodes=2`` with one rank per node, and
``trainer.nnodes=1`` with both ranks on one node. The worker group's STRICT_SPREAD placement
group puts the two-node run's ranks on both nodes; the 2-rank world, its data split and its
collectives are the same either way, so both runs end with the same weights, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows.train import train
from stages.engines.worker_group_ray import RayWorkerGroup

pytestmark = pytest.mark.slow
ray = pytest.importorskip(
    "ray", reason="the ray extra is not installed: pip install 'ppoflow[ray]'"
)

REPO = Path(__file__).resolve().parents[2]


def checkpoint_weights(actor_dir: Path) -> dict[str, torch.Tensor]:
    """The HF parameters in the checkpoint's DeepSpeed model file (ZeRO-0: rank 0 writes it)."""
    (model_file,) = (actor_dir / "state").glob("mp_rank_00_model_states.pt")
    module = torch.load(model_file, map_location="cpu", weights_only=False)["module"]
    return {name.removeprefix("lm."): tensor for name, tensor in module.items()}


#: the rollout backends run on both nodes: HF generate on the actor's module, and a vLLM (CPU
#: build) engine in each rank's process (``make test-vllm``: vLLM's environment has Ray)
ROLLOUTS = {
    "hf": (),
    "vllm": (
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.max_num_seqs=16",
    ),
}


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("rollout", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_grpo_on_two_nodes_ends_like_on_one_node(
    rollout, two_node_cluster, make_demo_inputs, tmp_path, tiny_run_overrides, monkeypatch
):
    if rollout == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm runs this)")
    from ray.util import placement_group_table
    from transformers import AutoModelForCausalLM

    nodes_used = []
    reserve = RayWorkerGroup._reserve_nodes

    def reserve_and_record(group, *args):
        reserve(group, *args)
        table = placement_group_table(group._placement_group)
        nodes_used.append(sorted(set(table["bundles_to_node_id"].values())))

    monkeypatch.setattr(RayWorkerGroup, "_reserve_nodes", reserve_and_record)
    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster.address)
    demo = make_demo_inputs(tmp_path / "demo", n_train=8, n_val=4)
    trained = {}
    for nnodes, per_node in ((2, 1), (1, 2)):
        home = tmp_path / f"nnodes-{nnodes}"
        overrides = tiny_run_overrides(
            demo,
            home,
            2,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "ppoflow.workers.backend=ray",
            f"trainer.n_gpus_per_node={per_node}",
            f"trainer.nnodes={nnodes}",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            *ROLLOUTS[rollout],
        )
        result = train(REPO / "configs" / "demo-cpu.yaml", overrides, str(home / "run"))
        assert result.steps == 2
        assert not ray.is_initialized()  # the group disconnected; the cluster runs on
        trained[nnodes] = checkpoint_weights(home / "checkpoints" / "global_step_2" / "actor")
    assert [len(nodes) for nodes in nodes_used] == [2, 1]  # one node of ranks per Ray node
    assert nodes_used[1][0] in nodes_used[0]
    initial = AutoModelForCausalLM.from_pretrained(demo / "model").state_dict()
    assert max((t - initial[n]).abs().max() for n, t in trained[1].items()) > 0  # it trained
    assert trained[2].keys() == trained[1].keys()
    for name, tensor in trained[1].items():
        torch.testing.assert_close(trained[2][name], tensor, atol=0, rtol=0, msg=name)
