"""Worker and rollout backends are registry entries; the engine code asks their specs.

Each check runs with temporary entries under names of their own, so it is proven to follow the
declared needs, not the built-in names.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dataproto import DataProto
from flows.engines import check_backend
from stages.config import load_config
from stages.engines.roles import ActorWorker
from stages.engines.rollout_backends import ROLLOUT_BACKENDS, RolloutBackendSpec
from stages.engines.worker_group import (
    WORKER_BACKENDS,
    LocalWorkerGroup,
    WorkerBackendSpec,
    make_worker_group,
)

REPO = Path(__file__).resolve().parents[2]


def test_builtin_entries_declare_their_needs() -> None:
    local, ray = WORKER_BACKENDS.get("local"), WORKER_BACKENDS.get("ray")
    assert (local.ranks_in_driver, local.max_world_size) == (True, 1)
    assert (ray.ranks_in_driver, ray.max_world_size) == (False, None)
    hf, vllm = ROLLOUT_BACKENDS.get("hf"), ROLLOUT_BACKENDS.get("vllm")
    assert (hf.max_tensor_parallel_size, hf.row_seeded) == (1, False)
    assert (vllm.max_tensor_parallel_size, vllm.runs_tensor_parallel, vllm.row_seeded) == (
        None,
        True,
        True,
    )


class _Missing(ImportError):
    pass


def _unavailable() -> None:
    raise _Missing("pip install the test backend")


@pytest.fixture
def backends():
    """A worker backend with ranks in other processes (deps missing), a capped in-driver one,
    and two rollout backends, one row-seeded."""
    WORKER_BACKENDS.add(
        "test_remote",
        WorkerBackendSpec(
            make_group=lambda factory, world_size, **kw: ("remote", world_size, kw),
            ranks_in_driver=False,
            max_world_size=None,
            check_available=_unavailable,
        ),
    )
    WORKER_BACKENDS.add(
        "test_pair",
        WorkerBackendSpec(
            make_group=lambda factory, world_size, **kw: LocalWorkerGroup(factory, **kw),
            ranks_in_driver=True,
            max_world_size=2,
            check_available=lambda: None,
        ),
    )
    for name, row_seeded in (("test_row_seeded", True), ("test_one_generator", False)):
        ROLLOUT_BACKENDS.add(
            name,
            RolloutBackendSpec(
                generate=lambda worker, prompts, settings: ("generated", worker, settings),
                max_tensor_parallel_size=None,
                why_max_tensor_parallel="",
                runs_tensor_parallel=False,
                row_seeded=row_seeded,
                log_probs_are_actors=False,
            ),
        )
    yield
    WORKER_BACKENDS.remove("test_remote")
    WORKER_BACKENDS.remove("test_pair")
    ROLLOUT_BACKENDS.remove("test_row_seeded")
    ROLLOUT_BACKENDS.remove("test_one_generator")


def demo_config(*overrides: str):
    return load_config(REPO / "configs" / "demo-cpu.yaml", list(overrides))


def test_world_size_is_bounded_by_the_backend_entry(backends) -> None:
    two = ("trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_mini_batch_size=16")
    check_backend(demo_config("ppoflow.workers.backend=test_pair", *two))
    three = ("trainer.n_gpus_per_node=3", "data.train_batch_size=48")
    with pytest.raises(ValueError, match="the test_pair backend runs at most 2 rank"):
        check_backend(
            demo_config(
                "ppoflow.workers.backend=test_pair",
                *three,
                "actor_rollout_ref.actor.ppo_mini_batch_size=12",
            )
        )


def test_tensor_parallelism_runs_only_where_the_rollout_entry_says_so(backends) -> None:
    def config(name: str):
        return demo_config(
            "ppoflow.workers.backend=test_pair",
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            f"actor_rollout_ref.rollout.name={name}",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        )

    check_backend(config("vllm"))  # one engine spans both ranks
    with pytest.raises(
        NotImplementedError,
        match=r"^actor_rollout_ref\.rollout\.tensor_model_parallel_size=2: the test_one_generator "
        r"rollout backend does not run an engine spanning ranks; set it to 1$",
    ):
        check_backend(config("test_one_generator"))


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_a_row_seeded_rollout_seeds_a_rank_by_its_first_row(backends, monkeypatch, rank) -> None:
    """Rank k of a 4-row chunk seeds row-seeded backends with s + 4k (its rows' seeds are the
    1-rank run's), the others with a seed of the rank's own."""
    from stages.engines import roles

    monkeypatch.setattr(roles, "_rank", lambda: rank)
    tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    prompts = DataProto.from_dict({"input_ids": torch.ones(4, 3)})
    seed = 2**62 + 5  # above rank_seed's range: reduced as on one rank
    seeds = {}
    for name in ("test_row_seeded", "test_one_generator"):
        config = demo_config(f"actor_rollout_ref.rollout.name={name}")
        worker = SimpleNamespace(config=config, tokenizer=tokenizer)
        seeds[name] = ActorWorker.generate_sequences(worker, prompts, seed=seed)[2].seed
    assert seeds["test_row_seeded"] == 5 + 4 * rank
    assert seeds["test_one_generator"] == roles.rank_seed(seed, rank)


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_the_ranks_of_one_tensor_parallel_engine_seed_alike(backends, monkeypatch, rank) -> None:
    """At tensor parallelism 2, ranks 2j and 2j + 1 got chunk j together: both seed as chunk j
    (row-seeded: s + 4j for 4-row chunks; else the seed of index j), so the engine's ranks
    sample in lockstep."""
    from stages.engines import roles

    monkeypatch.setattr(roles, "_rank", lambda: rank)
    tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    prompts = DataProto.from_dict({"input_ids": torch.ones(4, 3)})
    seeds = {}
    for name in ("test_row_seeded", "test_one_generator"):
        config = demo_config(
            f"actor_rollout_ref.rollout.name={name}",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "trainer.n_gpus_per_node=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        )
        worker = SimpleNamespace(config=config, tokenizer=tokenizer)
        seeds[name] = ActorWorker.generate_sequences(worker, prompts, seed=5)[2].seed
    assert seeds["test_row_seeded"] == 5 + 4 * (rank // 2)
    assert seeds["test_one_generator"] == roles.rank_seed(5, rank // 2)


def test_the_backend_checks_its_own_dependencies(backends) -> None:
    with pytest.raises(_Missing, match="pip install the test backend"):
        check_backend(demo_config("ppoflow.workers.backend=test_remote"))


def test_make_worker_group_uses_the_entry(backends) -> None:
    assert make_worker_group("test_remote", object, 3, x=1) == ("remote", 3, {"x": 1})
    with make_worker_group("test_pair", dict, 1, a=2) as group:
        assert group.worker == {"a": 2}


def test_the_actor_generates_with_the_configured_entry(backends) -> None:
    config = demo_config("actor_rollout_ref.rollout.name=test_row_seeded")
    tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    worker = SimpleNamespace(config=config, tokenizer=tokenizer)
    prompts = DataProto(batch=None, non_tensor_batch={}, meta_info={})
    tag, generated_by, settings = ActorWorker.generate_sequences(worker, prompts, greedy=True)
    assert (tag, generated_by, settings.do_sample) == ("generated", worker, False)


class SleepyEngine:
    """What ``_vllm_generate`` uses of a ``VLLMRollout``: generate, the last sync's probe (none
    yet), then sleep (level recorded)."""

    last_sync = None

    def __init__(self, has_sleep_mode: bool) -> None:
        self.has_sleep_mode, self.levels = has_sleep_mode, []

    def generate_sequences(self, prompts, settings):
        return prompts

    def sleep(self, level: int = 1) -> bool:
        self.levels.append(level)
        return self.has_sleep_mode


@pytest.mark.parametrize("has_sleep_mode", [True, False])
def test_a_freed_vllm_engine_sleeps_at_level_2_and_is_resynced(has_sleep_mode) -> None:
    """Level 2 frees the weights without a host copy; the engine is then stale, so the next
    rollout loads the actor's weights (where the platform cannot sleep, nothing was freed)."""
    engine = SleepyEngine(has_sleep_mode)
    rollout_cfg = SimpleNamespace(free_cache_engine=True)
    worker = SimpleNamespace(
        config=SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout_cfg)),
        vllm=engine,
        vllm_is_stale=False,
        vllm_rollout=lambda: engine,
    )
    prompts = DataProto.from_dict({"input_ids": torch.ones(2, 3)})
    ROLLOUT_BACKENDS.get("vllm").generate(worker, prompts, None)
    assert engine.levels == [2]
    assert worker.vllm_is_stale is has_sleep_mode
    rollout_cfg.free_cache_engine = False
    worker.vllm_is_stale = False
    ROLLOUT_BACKENDS.get("vllm").generate(worker, prompts, None)
    assert engine.levels == [2] and worker.vllm_is_stale is False


def test_a_vllm_engine_spanning_ranks_refuses_what_it_cannot_run() -> None:
    from stages.engines.roles import vllm_placement

    assert vllm_placement(2, 4, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}) == (
        True,
        {"distributed_executor_backend": "external_launcher"},
    )
    with pytest.raises(
        ValueError, match=r"^VLLM_ENABLE_V1_MULTIPROCESSING=1: a vLLM engine spanning 2 ranks"
    ):
        vllm_placement(2, 4, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    with pytest.raises(
        ValueError, match=r"tensor_model_parallel_size=4 does not divide the 6 actor ranks"
    ):
        vllm_placement(4, 6, {})
