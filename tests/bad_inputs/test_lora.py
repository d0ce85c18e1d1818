"""Bad LoRA inputs that need the model directory: ``ppoflow train`` refuses each when it starts,
before any weight is read — one line naming the key, exit status 1, no step or checkpoint.
``ppoflow export`` of a LoRA checkpoint onto another base model, and ``ppoflow validate --model``
of an adapter trained on another base, are one line each (exit status 2), nothing written.

(The LoRA settings that are wrong on their own — a negative rank, both spellings, a variant it
cannot run — are config errors: tests/config/test_verl_lora_script.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stages.data.tiny_model import make_tiny_model


def adapter_of_another_base(model: Path, tmp_path: Path) -> Path:
    """A PEFT adapter directory trained on another tiny model (seed 1)."""
    from peft import LoraConfig, get_peft_model

    from stages.engines.models import load_causal_lm

    other = make_tiny_model(tmp_path / "other-base", seed=1)
    peft = get_peft_model(load_causal_lm(other), LoraConfig(r=4, target_modules="all-linear"))
    peft.save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter"


# (test id, what the input is, overrides(model, tmp_path), needles)
CASES = [
    ("lora-targets-match-nothing", "actor_rollout_ref.model.target_modules that match no module",
     lambda m, t: ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.target_modules=[nope]"],
     ["actor_rollout_ref.model.target_modules = ('nope',)",
      "match no module the LoRA adapters can wrap in this model"]),
    ("lora-adapter-of-another-base", "actor_rollout_ref.model.lora_adapter_path trained on another model",
     lambda m, t: [f"actor_rollout_ref.model.lora_adapter_path={adapter_of_another_base(m, t)}"],
     ["actor_rollout_ref.model.lora_adapter_path = '{adapter}' was trained on base model",
      "is another model; point model.path at that base"]),
    ("lora-adapter-path-not-an-adapter", "actor_rollout_ref.model.lora_adapter_path without adapter_config.json",
     lambda m, t: [f"actor_rollout_ref.model.lora_adapter_path={t}"],
     ["actor_rollout_ref.model.lora_adapter_path = '{tmp}': no adapter_config.json there"]),
]  # fmt: skip


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize(
    ("described", "overrides", "needles"), [pytest.param(*c[1:], id=c[0]) for c in CASES]
)
def test_a_bad_lora_input_stops_the_start(
    ppoflow, expect, demo, tmp_path, described, overrides, needles
):
    extra = overrides(demo.model, tmp_path)
    result = ppoflow(
        "train", "demo-cpu", *demo.overrides(tmp_path, *extra), "--run-dir", tmp_path / "run"
    )
    filled = [n.format(adapter=tmp_path / "adapter", tmp=tmp_path) for n in needles]
    expect(result, 1, *filled, input=described)
    assert not list((tmp_path / "run").glob("step_*"))
    assert not (tmp_path / "checkpoints").exists()


def lora_checkpoint(model: Path, root: Path) -> Path:
    """An untrained rank-4 LoRA actor checkpoint on ``model``: ``root/global_step_1``."""
    from stages.config import load_config
    from stages.engines.checkpoint import checkpoint_dir
    from stages.engines.checkpoint_manifest import write_step_manifest
    from stages.engines.roles import ActorWorker

    cfg = load_config(
        Path(__file__).resolve().parents[2] / "configs" / "demo-cpu.yaml",
        [f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.lora_rank=4"],
    )
    ActorWorker(cfg, total_training_steps=1).save_checkpoint(str(checkpoint_dir(root, 1, "actor")))
    write_step_manifest(root, 1, ["actor"])
    return root / "global_step_1"


# (test id, what the input is, command with {run} / {ckpt} / {other} / {adapter} / {out}, needles)
COMMANDS = [
    ("export-lora-onto-another-base",
     "`export CKPT OUT --base DIR`, a LoRA checkpoint and DIR another model than its base",
     ["export", "{ckpt}", "{out}", "--base", "{other}"],
     ["{other} is not the base model the LoRA adapters of", "the checkpoint records blake3:",
      "pass --base with the model directory the run trained on"]),
    ("validate-adapter-of-another-base",
     "`validate RUN --model DIR`, DIR an adapter trained on another base model",
     ["validate", "{run}", "--model", "{adapter}"],
     ["--model {adapter} is an adapter trained on base model '{other}', but the run's "
      "actor_rollout_ref.model.path", "is another model"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "args", "needles"), [pytest.param(*c[1:], id=c[0]) for c in COMMANDS]
)
def test_a_lora_export_or_validate_on_another_base_is_one_line(
    ppoflow, expect, fill, unchanged, finished, demo, tmp_path, described, args, needles
):
    adapter = adapter_of_another_base(demo.model, tmp_path)
    paths = {
        "run": finished.run,
        "ckpt": lora_checkpoint(demo.model, tmp_path / "ckpt"),
        "other": tmp_path / "other-base",
        "adapter": adapter,
        "out": tmp_path / "out",
    }
    with unchanged(*finished.dirs, tmp_path / "ckpt"):
        result = ppoflow(*fill(args, **paths))
    expect(result, 2, *fill(needles, **paths), input=described)
    assert not (tmp_path / "out").exists()
