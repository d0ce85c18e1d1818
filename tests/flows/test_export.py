"""``ppoflow export``: a checkpoint's actor as a plain Hugging Face model directory.

Fast (engine checkpoints of the tiny model after one update, no Prefect): every ZeRO stage
exports the engine's weights bit for bit in a directory ``from_pretrained`` loads; a checkpoint
file that names a Python global beyond tensors and plain values is refused before anything
unpickles it, also under ZeRO-3 where DeepSpeed's own reader would unpickle it; bad arguments
are one line with exit status 2.

Slow (one module-scoped 2-step training with a checkpoint after each step and validation before
and after each step, shared by every test below): the export of step 2 generates the greedy
tokens of the checkpoint loaded back into a training engine by DeepSpeed; ``ppoflow train``
starts from the export; ``ppoflow validate`` on the checkpoint prints the validation metrics the
training logged at that step, and on the export the same; ``ppoflow runs`` lists the run and a
re-run branch of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import deepspeed
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors import safe_open
from tensordict import TensorDict
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from dataproto import DataProto
from flows.cli.app import app
from flows.runs.store import RunStore, StepJournal
from stages.config import PPORunConfig, load_config
from stages.engines.actor import PPOUpdateSettings, update_actor
from stages.engines.batching import MicroBatching
from stages.engines.checkpoint import MANIFEST, checkpoint_dir, save_engine_checkpoint
from stages.engines.checkpoint_manifest import write_step_manifest
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm
from stages.metrics.naming import sanitize_metric_name

REPO = Path(__file__).resolve().parents[2]
EXPORTED_FILES = {
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
}
LOSS = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}
UPDATE = PPOUpdateSettings(mini_batch_size=4, micro=MicroBatching(micro_batch_size=4))


def export(*args: str):
    return CliRunner().invoke(app, ["export", *map(str, args)])


def one_error_line(result) -> str:
    """The command's one stderr line (asserting there is exactly one, and exit status 2)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.output)
    assert lines[0].startswith("error: ")
    return lines[0]


# --- engine checkpoints of each ZeRO stage ------------------------------------------------------


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    from stages.data import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("base") / "model")


def rollout_batch(vocab: int, P: int = 5, R: int = 4, seed: int = 1) -> DataProto:
    """4 left-padded prompts ‖ right-padded responses with random advantages."""
    generator = torch.Generator().manual_seed(seed)
    attention_mask = torch.zeros(4, P + R, dtype=torch.long)
    for row, (p, r) in enumerate([(3, 4), (5, 2), (1, 1), (4, 3)]):
        attention_mask[row, P - p : P + r] = 1
    input_ids = torch.randint(3, vocab, (4, P + R), generator=generator) * attention_mask
    response_mask = attention_mask[:, P:]
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "prompts": input_ids[:, :P],
        "responses": input_ids[:, P:],
        "response_mask": response_mask,
        "advantages": torch.randn(4, R, generator=generator) * response_mask,
        "old_log_probs": (-3.0 + 0.3 * torch.randn(4, R, generator=generator)) * response_mask,
    }
    return DataProto(TensorDict(tensors, batch_size=[4]), {}, {"temperature": 1.0})


def engine_checkpoint(base: Path, root: Path, zero_stage: int, dtype: str) -> dict:
    """One PPO update of ``base`` on a ZeRO ``zero_stage`` engine in ``dtype``, saved as
    ``root/global_step_1/actor``; returns the engine's full weights (Hugging Face names)."""
    torch.manual_seed(0)
    lm = load_causal_lm(base, dtype=dtype)
    settings = EngineSettings(zero_stage=zero_stage, dtype=dtype, lr=1e-2)
    engine = initialize_engine(ResponseLogProbModel(lm), settings)
    update_actor(engine, rollout_batch(lm.config.vocab_size), UPDATE, LOSS)
    save_engine_checkpoint(engine, checkpoint_dir(root, 1, "actor"))
    write_step_manifest(root, 1, ["actor"])  # what save_run_checkpoint adds after the roles
    params = dict(engine.module.lm.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        return {name: param.detach().clone() for name, param in params.items()}


@pytest.mark.parametrize(
    ("zero_stage", "dtype"),
    [(0, "float32"), (1, "float32"), (2, "bfloat16"), (3, "float32"), (3, "bfloat16")],
    ids=str,
)
def test_each_zero_stage_exports_the_engine_weights(base_model, tmp_path, zero_stage, dtype):
    weights = engine_checkpoint(base_model, tmp_path / "ckpt", zero_stage, dtype)
    out = tmp_path / "hf"
    result = export(tmp_path / "ckpt" / "global_step_1", out, "--base", base_model)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == str(out)
    assert {p.name for p in out.iterdir()} >= EXPORTED_FILES
    assert not list(out.glob("*.bin")) and not list(out.glob("*.pt"))  # no pickles
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == getattr(torch, dtype)  # the engine's compute dtype by default
    loaded = model.state_dict()
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor), name
    base = AutoModelForCausalLM.from_pretrained(base_model).state_dict()
    assert not torch.equal(
        loaded["model.layers.0.mlp.up_proj.weight"].float(),
        base["model.layers.0.mlp.up_proj.weight"],
    )
    with safe_open(out / "model.safetensors", "pt") as stored:
        stored_names = set(stored.keys())
    assert "lm_head.weight" not in stored_names  # tied to the embeddings, stored once
    provenance = json.loads((out / "ppoflow_export.json").read_text())
    assert provenance["step"] == 1 and provenance["zero_stage"] == zero_stage


def test_dtype_option_casts_and_force_replaces(base_model, tmp_path):
    weights = engine_checkpoint(base_model, tmp_path / "ckpt", 0, "float32")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.txt").write_text("an earlier export")
    source = tmp_path / "ckpt" / "global_step_1" / "actor"
    refused = one_error_line(export(source, out, "--base", base_model))
    assert "not empty" in refused and "--force" in refused
    result = export(source, out, "--base", base_model, "--dtype", "bfloat16", "--force")
    assert result.exit_code == 0, result.output
    assert not (out / "stale.txt").exists()
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    embed = "model.embed_tokens.weight"
    assert torch.equal(model.state_dict()[embed], weights[embed].to(torch.bfloat16))


class Trap:
    """Unpickled, this creates the file ``marker`` (``open(marker, "w")``): the stand-in for a
    hostile checkpoint's payload."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickled_global_is_refused_before_it_runs(base_model, tmp_path):
    marker = tmp_path / "code-ran"
    actor = checkpoint_dir(tmp_path / "ckpt", 1, "actor")
    (actor / "state").mkdir(parents=True)
    (actor / MANIFEST).write_text(json.dumps({"format": 1, "world_size": 1, "zero_stage": 0}))
    file = actor / "state" / "mp_rank_00_model_states.pt"
    torch.save({"module": {"lm.x": torch.zeros(1)}, "extra": Trap(marker)}, file)
    write_step_manifest(tmp_path / "ckpt", 1, ["actor"])  # whoever planted it signs it too
    line = one_error_line(export(actor, tmp_path / "hf", "--base", base_model))
    assert "refusing to read" in line and "mp_rank_00_model_states.pt" in line
    assert "names io.open" in line  # the global it refused
    assert not marker.exists() and not (tmp_path / "hf").exists()
    torch.load(file, weights_only=False)  # the trap is real: an unrestricted load runs it
    assert marker.exists()


def test_zero3_optimizer_files_are_checked_before_deepspeed_reads_them(base_model, tmp_path):
    engine_checkpoint(base_model, tmp_path / "ckpt", 3, "float32")
    marker = tmp_path / "code-ran"
    (optim,) = (tmp_path / "ckpt").glob("global_step_1/actor/state/*_optim_states.pt")
    state = torch.load(optim, weights_only=False)
    state["optimizer_state_dict"]["extra"] = Trap(marker)
    torch.save(state, optim)
    write_step_manifest(tmp_path / "ckpt", 1, ["actor"])
    line = one_error_line(
        export(tmp_path / "ckpt" / "global_step_1", tmp_path / "hf", "--base", base_model)
    )
    assert "refusing to read" in line and optim.name in line
    assert not marker.exists()


# --- bad arguments ------------------------------------------------------------------------------


def make_fake_run(tmp_path: Path, checkpoints: str) -> Path:
    """A run directory with two done steps and actor checkpoint manifests of steps 1 and 2 in
    ``tmp_path/ckpt``, which its config names as ``checkpoints``, and a stand-in base model
    directory ``tmp_path/model`` (a config.json only); its run_info.json says it started in
    ``tmp_path``."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    cfg = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"trainer.default_local_dir={checkpoints}",
            "trainer.total_training_steps=2",
            f"actor_rollout_ref.model.path={tmp_path}/model",
        ],
    )
    store = RunStore(tmp_path / "run")
    store.save_config(cfg)
    store.save_json(
        "run_info.json",
        {
            "mlflow_run_id": None,
            "mlflow_tracking_uri": None,
            "mlflow_experiment": None,
            "working_dir": str(tmp_path),
        },
    )
    for step in (1, 2):
        store.write_journal(StepJournal(step, status="done"))
        actor = checkpoint_dir(tmp_path / "ckpt", step, "actor")
        actor.mkdir(parents=True)
        (actor / MANIFEST).write_text(json.dumps({"format": 1, "world_size": 1, "zero_stage": 0}))
        write_step_manifest(tmp_path / "ckpt", step, ["actor"])
    return Path(store.root)


@pytest.fixture
def fake_run(tmp_path) -> Path:
    return make_fake_run(tmp_path, f"{tmp_path}/ckpt")


def test_relative_run_paths_are_read_from_where_the_run_started(tmp_path, monkeypatch):
    run = make_fake_run(tmp_path, "ckpt")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    line = one_error_line(export(run, tmp_path / "hf", "--step", "3"))
    assert f"steps with a checkpoint under {tmp_path}/ckpt: [1, 2]" in line


def test_a_missing_step_lists_the_checkpointed_steps(fake_run, tmp_path):
    line = one_error_line(export(fake_run, tmp_path / "hf", "--step", "3"))
    assert "no checkpoint of step 3" in line and "[1, 2]" in line
    line = one_error_line(export(fake_run, tmp_path / "hf"))
    assert "--step" in line and "[1, 2]" in line


def test_not_a_run_or_checkpoint_is_one_line(tmp_path, base_model):
    line = one_error_line(export(tmp_path, tmp_path / "hf", "--step", "1"))
    assert "neither a run directory" in line
    line = one_error_line(export(base_model, tmp_path / "hf"))  # a model dir has config.json
    assert "neither a run directory" in line


def test_a_checkpoint_folder_needs_its_base_model(fake_run, tmp_path):
    line = one_error_line(export(tmp_path / "ckpt" / "global_step_2", tmp_path / "hf"))
    assert "--base" in line and "actor_rollout_ref.model.path" in line


def test_out_may_not_hold_what_is_read(fake_run, tmp_path):
    line = one_error_line(export(fake_run, tmp_path / "ckpt", "--step", "1", "--force"))
    assert "which the export reads" in line


# --- from a trained run -------------------------------------------------------------------------

SPREAD_SCORE = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
    "    return float(sum(map(ord, solution_str)) % 5) / 4\n"
)


def scale_layers(model_dir: Path, factor: float = 6.0) -> None:
    """Scale the tiny model's layer matrices: at init scale its tied embeddings dominate and
    greedy decoding repeats the last prompt token whatever the weights, which would hide a
    wrong checkpoint."""
    model = load_causal_lm(model_dir)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".layers." in name and parameter.ndim == 2:
                parameter.mul_(factor)
    model.save_pretrained(model_dir)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, make_demo_inputs, tiny_run_overrides, prefect_harness) -> dict:
    """2 GRPO steps of the (scaled) tiny model with a large lr, a checkpoint after each step,
    greedy validation before training and after each step with a scorer whose scores spread
    over the response text; the run dir under ``root/runs``, MLflow in ``root/mlflow.db``."""
    from flows.train import train

    root = make_demo_inputs(tmp_path_factory.mktemp("export"))
    scale_layers(root / "model")
    (root / "spread_score.py").write_text(SPREAD_SCORE)
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        tiny_run_overrides(
            root,
            root,
            2,
            "trainer.save_freq=1",
            "trainer.test_freq=1",
            "trainer.val_before_train=true",
            "actor_rollout_ref.actor.optim.lr=0.01",
            f"reward.custom_reward_function.path={root}/spread_score.py",
        ),
        str(root / "runs" / "trained"),
    )
    return {"root": root, "run_dir": result.run_dir, "mlflow_run_id": result.mlflow_run_id}


@pytest.fixture(scope="module")
def exported(trained) -> Path:
    out = trained["root"] / "export-step2"
    result = export(trained["run_dir"], "--step", "2", out)
    assert result.exit_code == 0, result.output
    return out


def logged_at(trained: dict, step: int) -> dict[str, float]:
    """The validation metrics the training logged to MLflow at ``step`` (original names)."""
    client = MlflowClient(tracking_uri=f"sqlite:///{trained['root']}/mlflow.db")
    run = client.get_run(trained["mlflow_run_id"])
    logged = {}
    for name in run.data.metrics:
        history = client.get_metric_history(run.info.run_id, name)
        values = [point.value for point in history if point.step == step]
        if name.startswith("val-") and values:
            logged[name] = values[-1]
    return logged


def val_prompts(trained: dict, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of the run's validation prompts, left-padded."""
    cfg = PPORunConfig.model_validate(RunStore(trained["run_dir"]).load_config())
    from stages.data.from_config import load_split

    dataset = load_split(cfg.data, tokenizer, "val")
    prompts = dataset.collate(list(range(len(dataset))))
    return prompts.batch["input_ids"], prompts.batch["attention_mask"]


def greedy(model, input_ids, attention_mask) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
            max_new_tokens=8, pad_token_id=0, eos_token_id=1, use_cache=True,
        )  # fmt: skip
    return out[:, input_ids.shape[1] :]


@pytest.mark.slow
def test_export_generates_the_checkpoint_greedy_tokens(trained, exported):
    from stages.engines.roles import ActorWorker

    assert {p.name for p in exported.iterdir()} >= EXPORTED_FILES
    cfg = PPORunConfig.model_validate(RunStore(trained["run_dir"]).load_config())
    worker = ActorWorker(cfg, total_training_steps=2)
    worker.load_checkpoint(str(checkpoint_dir(cfg.trainer.default_local_dir, 2, "actor")))
    model = AutoModelForCausalLM.from_pretrained(exported)
    tokenizer = AutoTokenizer.from_pretrained(exported)
    input_ids, attention_mask = val_prompts(trained, tokenizer)
    worker.lm.eval()
    expected = greedy(worker.lm, input_ids, attention_mask)
    assert torch.equal(greedy(model, input_ids, attention_mask), expected)
    for name, tensor in worker.lm.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    base = AutoModelForCausalLM.from_pretrained(trained["root"] / "model")
    assert not torch.equal(greedy(base, input_ids, attention_mask), expected)  # it trained


@pytest.mark.slow
def test_training_starts_from_an_export(trained, exported, tiny_run_overrides, tmp_path):
    from flows.train import train

    root = trained["root"]
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        tiny_run_overrides(root, tmp_path, 2, f"actor_rollout_ref.model.path={exported}"),
        str(tmp_path / "run"),
    )
    store = RunStore(result.run_dir)
    assert store.steps() == [1, 2]
    for step in (1, 2):
        journal = store.read_journal(step)
        assert journal.status == "done"
        assert np.isfinite(journal.metrics["actor/pg_loss"])
    assert store.load_config()["actor_rollout_ref"]["model"]["tokenizer_path"] == str(exported)


@pytest.mark.slow
def test_validate_on_the_checkpoint_prints_the_logged_metrics(trained):
    result = CliRunner().invoke(app, ["validate", trained["run_dir"], "--step", "2"])
    assert result.exit_code == 0, result.output
    logged = logged_at(trained, 2)
    before = logged_at(trained, 0)
    assert logged != before  # training changed what validation sees: the check has power
    lines = result.stdout.splitlines()
    (score_line,) = [line for line in lines if line.startswith("val score: ")]
    (reward,) = [name for name in logged if "/reward/mean" in name]
    assert score_line == f"val score: {logged[reward]:.6f}"
    printed = {
        sanitize_metric_name(line.split()[0]): line.split()[1]
        for line in lines
        if line.startswith("  val-")
    }
    assert printed == {name: f"{value:.6f}" for name, value in logged.items()}


@pytest.mark.slow
def test_validate_on_the_export_equals_the_logged_metrics_exactly(trained, exported):
    from flows.validate_run import validate_run

    run = validate_run(trained["run_dir"], model_dir=exported)
    metrics = {sanitize_metric_name(k): v for k, v in run.result.metrics.items()}
    assert metrics == logged_at(trained, 2)
    assert run.model == str(exported) and run.prompts == 8 and run.greedy


@pytest.mark.slow
def test_runs_lists_the_run_and_a_rerun_branch(trained):
    from flows.rerun import rerun

    runs_dir = trained["root"] / "runs"
    branch = rerun(
        trained["run_dir"], 2, "advantage", "advantage", ["algorithm.adv_estimator=rloo"],
        str(runs_dir / "branch"),
    )  # fmt: skip
    result = CliRunner().invoke(app, ["runs", str(runs_dir), "--json"])
    assert result.exit_code == 0, result.output
    listed = {Path(run["run_dir"]).name: run for run in json.loads(result.stdout)}
    assert list(listed) == ["trained", "branch"]  # by start time
    run, fork = listed["trained"], listed["branch"]
    journal = RunStore(trained["run_dir"]).read_journal(2)
    assert (run["status"], run["steps_done"], run["steps_total"]) == ("done", 2, 2)
    assert run["score"] == journal.metrics["critic/score/mean"]
    assert run["mlflow_run_id"] == trained["mlflow_run_id"] and run["mlflow_status"] == "FINISHED"
    (reward,) = [name for name in logged_at(trained, 2) if "/reward/mean" in name]
    assert (run["val_score"], run["val_step"]) == (logged_at(trained, 2)[reward], 2)
    assert (fork["status"], fork["steps_total"], fork["parent"]) == ("done", 1, trained["run_dir"])
    assert branch.run_dir == fork["run_dir"]
    table = CliRunner().invoke(app, ["runs", str(runs_dir)]).stdout
    (line,) = [line for line in table.splitlines() if " branch " in line]
    assert line.split()[-1] == "trained"  # the parent, relative to DIR
