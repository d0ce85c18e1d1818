"""configs/gpu-8x.yaml and configs/gpu-2node.yaml load and say what docs/scaling.md says they do;
the docs name only config keys, files and `ppoflow` commands that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from stages.config import load_config

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    REPO / "docs" / "scaling.md",
    REPO / "docs" / "deployment.md",
    REPO / "docker" / "README.md",
]
ROOTS = ("data", "actor_rollout_ref", "critic", "algorithm", "reward", "trainer", "ppoflow")


@pytest.mark.parametrize(
    ("name", "nnodes", "model"),
    [("gpu-8x", 1, "Qwen/Qwen2.5-7B-Instruct"), ("gpu-2node", 2, "Qwen/Qwen2.5-14B-Instruct")],
)
def test_gpu_recipes_load_with_the_documented_settings(name, nnodes, model):
    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    trainer, arr = cfg.trainer, cfg.actor_rollout_ref
    assert (trainer.n_gpus_per_node, trainer.nnodes, trainer.device) == (8, nnodes, "cuda")
    assert cfg.ppoflow.workers.backend == "ray"
    assert arr.model.path == model
    # one vLLM engine per rank, in the rank's process beside its actor and reference
    assert arr.rollout.name == "vllm" and arr.rollout.tensor_model_parallel_size == 1
    assert arr.actor.zero_stage == 3 and arr.ref.param_offload and arr.rollout.free_cache_engine
    assert cfg.ppoflow.workers.colocate
    dp = trainer.n_gpus_per_node * trainer.nnodes
    per_rank = arr.actor.ppo_mini_batch_size * arr.rollout.n // dp
    assert per_rank == 40 and per_rank % arr.actor.ppo_micro_batch_size_per_gpu == 0


@pytest.mark.parametrize("config", ["configs/gpu-8x.yaml", "configs/gpu-2node.yaml", "gpu-8x"])
def test_config_show_prints_the_recipe(config, monkeypatch):
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(app, ["config", "show", "--config", config])
    assert result.exit_code == 0, result.output
    assert "backend: ray" in result.output and "name: vllm" in result.output


@pytest.mark.parametrize(("config", "ranks"), [("gpu-8x", 8), ("gpu-2node", 16)])
def test_the_recipes_pass_the_run_checks_and_print_their_layout(config, ranks, monkeypatch):
    """What `ppoflow train` checks before it builds an engine passes (the GPU count aside: this
    machine has none), and the layout is one colocated process per rank, each with vLLM."""
    pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'ppoflow[ray]'")
    from flows.engines import check_backend

    monkeypatch.chdir(REPO)
    check_backend(load_config(REPO / "configs" / f"{config}.yaml"))
    result = CliRunner().invoke(app, ["config", "show", "--layout", "--config", config])
    assert result.exit_code == 0 and "error" not in result.output, result.output
    lines = result.output.splitlines()
    assert f"{ranks} rank processes" in lines[0] and "STRICT_SPREAD" in lines[0]
    assert len(lines) == 1 + ranks
    assert all("actor (DeepSpeed ZeRO-3, rollout vllm) + ref (ZeRO-3" in line for line in lines[1:])


def documented_keys(text: str) -> set[str]:
    keys = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for token in re.split(r"[\s,=:]+", span):
            if token.split(".")[0] in ROOTS and "." in token:
                keys.add(token.rstrip("."))
    return keys


def has_key(tree: dict, dotted: str) -> bool:
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_docs_name_only_existing_config_keys():
    tree = load_config(None).model_dump()
    keys = set().union(*(documented_keys(doc.read_text(encoding="utf-8")) for doc in DOCS))
    assert {"trainer.nnodes", "ppoflow.workers.backend", "ppoflow.artifact_dir"} <= keys
    assert sorted(k for k in keys if not has_key(tree, k)) == []


def test_docs_name_only_existing_files():
    pattern = re.compile(r"(?<![\w/.])((?:docker|docs|configs|flows|stages|tests)/[\w./-]*\w)")
    for doc in DOCS:
        for path in pattern.findall(doc.read_text(encoding="utf-8")):
            base = doc.parent if path.startswith(("../",)) else REPO
            assert (base / path).exists(), f"{doc.name} names {path}, which does not exist"


def code(text: str) -> str:
    """The fenced blocks and inline code spans of a Markdown text."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return "\n".join(blocks + re.findall(r"`([^`\n]+)`", prose))


def test_docs_use_only_existing_ppoflow_commands():
    commands = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    for doc in DOCS:
        for used in re.findall(r"\bppoflow ([a-z][a-z-]+)", code(doc.read_text(encoding="utf-8"))):
            assert used in commands, f"{doc.name} uses `ppoflow {used}`, not a command"
