"""``trainer.*`` (verl's keys) and ``ppoflow.*`` (settings verl has no counterpart for)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from dataproto.fingerprint import DEFAULT_DIGEST, Digest
from stages.config._base import ConfigModel
from stages.config.choices import (
    HealthCheckName,
    PolicyScheduleName,
    WorkerBackendName,
    check_registered,
)
from stages.config.schema_health import HealthCheckConfig
from stages.engines.worker_group import WORKER_BACKENDS
from stages.metrics.sinks import METRIC_SINKS, missing_package


def _metric_sink(name: str) -> str:
    return check_registered(name, METRIC_SINKS.names(), "metric sink")


#: ``trainer.logger`` item: a name in ``stages.metrics.sinks.METRIC_SINKS``
MetricSinkName = Annotated[str, AfterValidator(_metric_sink)]


class TrainerConfig(ConfigModel):
    """The run: length, validation and checkpoint cadence, resume, devices, logging."""

    project_name: str = Field(
        "ppoflow",
        description="Project (MLflow experiment) name [ppoflow: verl uses verl_examples] (name)",
    )
    experiment_name: str = Field(
        "default", description="Run name inside the project [ppoflow: verl uses gsm8k] (name)"
    )
    total_epochs: int = Field(30, ge=1, description="Passes over the training set (epochs)")
    total_training_steps: int | None = Field(
        None,
        ge=1,
        description="Stop after this many steps; null = steps per epoch × total_epochs (steps)",
    )
    test_freq: int = Field(
        -1,
        ge=-1,
        description="Validate every this many steps and at the last step; ≤ 0 = never (steps)",
    )
    save_freq: int = Field(
        -1,
        ge=-1,
        description="Checkpoint every this many steps and at the last step; ≤ 0 = never (steps)",
    )
    val_before_train: bool = Field(True, description="Validate once before the first step (bool)")
    val_only: bool = Field(False, description="Validate once and stop (bool)")
    critic_warmup: int = Field(
        0,
        ge=0,
        description="Steps that train only the critic before the actor updates start (steps)",
    )
    balance_batch: bool = Field(
        True, description="Reorder rows so DP ranks get similar token workloads (bool)"
    )
    log_val_generations: int = Field(
        0, ge=0, description="Validation samples logged as a table each validation (samples)"
    )
    rollout_data_dir: str | None = Field(
        None, description="Dump each step's generations as JSONL here; null = off (path)"
    )
    validation_data_dir: str | None = Field(
        None, description="Dump validation generations as JSONL here; null = off (path)"
    )
    resume_mode: Literal["disable", "auto", "resume_path"] = Field(
        "auto",
        description="disable: start fresh; auto: latest checkpoint in default_local_dir if any; resume_path: resume_from_path (choice)",
    )
    resume_from_path: str | None = Field(
        None,
        description="Checkpoint folder (…/global_step_N) to resume from; only with resume_mode resume_path (path)",
    )
    default_local_dir: str | None = Field(
        None,
        description="Checkpoint root; null = checkpoints/<project_name>/<experiment_name> (path)",
    )
    max_actor_ckpt_to_keep: int | None = Field(
        None,
        ge=1,
        description="Keep only the newest this many actor checkpoints; null = all (checkpoints)",
    )
    max_critic_ckpt_to_keep: int | None = Field(
        None,
        ge=1,
        description="Keep only the newest this many critic checkpoints; null = all (checkpoints)",
    )
    n_gpus_per_node: int = Field(
        8, ge=1, description="Ranks per node, one device each (on CPU: processes) (ranks)"
    )
    nnodes: int = Field(1, ge=1, description="Nodes; DP size = n_gpus_per_node × nnodes (nodes)")
    device: Literal["cpu", "cuda"] = Field("cuda", description="Device type of every rank (choice)")
    logger: list[MetricSinkName] = Field(
        ["console", "mlflow"],
        description="Metric sinks (stages.metrics.sinks): console, mlflow, wandb (offline unless "
        "WANDB_MODE or WANDB_API_KEY is set), tensorboard (<run dir>/tensorboard) [ppoflow: "
        "default mlflow where verl's is wandb] (names)",
    )
    seed: int = Field(
        42,
        description="Global seed of Python/NumPy/torch RNGs and of data.seed when null [ppoflow-only] (seed)",
    )

    @field_validator("logger", mode="before")
    @classmethod
    def _one_logger_is_a_list(cls, value: object) -> object:
        """Accept ``logger: console`` as verl does."""
        return [value] if isinstance(value, str) else value

    @field_validator("logger")
    @classmethod
    def _sink_packages_installed(cls, names: list[str]) -> list[str]:
        """A listed sink whose optional package is missing names the extra to install."""
        problems = [problem for name in names if (problem := missing_package(name))]
        if problems:
            raise ValueError("; ".join(problems))
        return names


class WorkersConfig(ConfigModel):
    """Where the engine ranks run."""

    backend: WorkerBackendName = Field(
        "local",
        description="A name in stages.engines.worker_group.WORKER_BACKENDS; local: ranks in this process (one rank); ray: Ray actors (choice)",
    )
    num_cpus_per_rank: float = Field(
        1,
        gt=0,
        description="Ray CPUs reserved per rank; also the rank's OMP_NUM_THREADS (CPUs)",
    )
    connect_timeout_s: float = Field(
        60.0,
        gt=0,
        description="ray backend with RAY_ADDRESS set: how long connecting to that cluster may "
        "take before the run stops with one error line naming it (seconds)",
    )
    colocate: bool = Field(
        True,
        description="Every model role of a rank (actor, ref, critic) in one process on one "
        "device, as verl colocates them: N devices run GRPO with a KL loss, not 2N; false: each "
        "role's ranks in processes and on devices of their own (ray backend only: local runs "
        "every role in this process) (bool)",
    )

    @model_validator(mode="after")
    def _colocation_is_a_choice_of_the_backend(self) -> WorkersConfig:
        if not self.colocate and WORKER_BACKENDS.get(self.backend).ranks_in_driver:
            raise ValueError(
                f"colocate=false gives each role processes of its own, but the {self.backend} "
                "backend runs every role in this process; set ppoflow.workers.backend=ray, or "
                "leave colocate true"
            )
        return self


class ArtifactRetentionConfig(ConfigModel):
    """How a run writes its stage artifacts (flows/runs/artifact_writer.py) and which steps keep them
    (flows/runs/retention.py; keep_last and keep_every both null keep every step)."""

    write_in_background: bool = Field(
        True,
        description="Write each stage's artifact on a background thread while the step goes on "
        "(its fingerprint is computed in memory first); the step ends when its writes have; "
        "false writes it inside the stage (bool)",
    )

    keep_last: int | None = Field(
        None,
        ge=1,
        description="Keep the stage artifacts of the newest K steps; older ones are pruned after "
        "each step unless another rule keeps them; null = this rule keeps none, both null = "
        "prune nothing (steps)",
    )
    keep_every: int | None = Field(
        None,
        ge=1,
        description="Also keep the artifacts of every N-th step (step % N == 0); steps a "
        "checkpoint or a re-run branch needs are always kept (steps)",
    )


class PPOFlowConfig(ConfigModel):
    """[ppoflow-only] Artifacts, caching, tracking and worker placement."""

    artifact_dir: str = Field(
        "runs",
        description="Root of the run directories (stage artifacts); a local path or fsspec URL (path)",
    )
    mlflow_tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI; wins over MLFLOW_TRACKING_URI; null with that unset = "
        "the project store <artifact_dir>/mlflow.db, artifacts in <artifact_dir>/mlflow-artifacts "
        "(URI)",
    )
    mlflow_call_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long each call to MLflow's process (the mlflow sink) may wait for its "
        "answer; one that does not answer in time is killed and a new one continues the run, at "
        "most 3 times a run (the first answer of each, while MLflow is imported, and the call "
        "that creates a new store may take up to 600 s or this, whichever is longer) (seconds)",
    )
    mlflow_system_metrics_interval_s: float | None = Field(
        10.0,
        gt=0,
        description="Seconds between samples of MLflow's system metrics (system/*: CPU, memory, "
        "disk, network, and GPUs where pynvml finds them) in the mlflow sink's run; null = none "
        "(seconds)",
    )
    mlflow_metrics_interval_s: float = Field(
        5.0,
        ge=0,
        description="How long the mlflow sink may hold a step's metrics to send them with the "
        "next steps' in one call, which costs MLflow's store less than a call each: steps that "
        "come sooner than this after the first one held go together once it has waited this "
        "long; a step with a metric name not logged before, any other call and the run's end "
        "send at once, and a resume replays what a kill lost from the steps' journals; 0 = "
        "every step at once (seconds)",
    )
    log_train_generations: int = Field(
        2,
        ge=0,
        description="Prompt groups of the training batch (every sample of each) logged as the "
        "table train_generations/step_<K>.json, with score, advantage, response length and the "
        "reward extras, and as the sample page train_samples/step_<K>.html (each token coloured "
        "by its advantage, ratio or log-prob), at step 1, at every validation step "
        "(trainer.test_freq) and at the last step, to the sinks that take tables (MLflow); 0 = "
        "none (count)",
    )
    cache: bool = Field(
        True, description="Reuse a stage's stored output when its cache key matches (bool)"
    )
    artifact_digest: Digest = Field(
        DEFAULT_DIGEST,
        description="File digest of the stage artifacts: blake3 (about half sha256's CPU per "
        "byte), or sha256_tree (sha256 all the way down); the fingerprint is a sha256 either way "
        "(choice)",
    )
    artifacts: ArtifactRetentionConfig = Field(
        default_factory=ArtifactRetentionConfig,
        description="How the steps' stage artifacts are written and kept (section)",
    )
    schedule: PolicyScheduleName = Field(
        "on_policy",
        description="A name in stages.schedules.POLICY_SCHEDULES: which weights generate a "
        "step's batch; on_policy: the weights that train on it; one_step_off: the weights one "
        "update older, on a copy of the policy that generates step k + 1 while step k trains "
        "(verl's one_step_off_policy recipe); fully_async: up to ⌊(1 + s)·T⌋ batches ahead, the "
        "copy synced every T steps (verl's fully_async_policy; async_training.*) (choice)",
    )
    workers: WorkersConfig = Field(
        default_factory=WorkersConfig, description="Engine rank placement (section)"
    )
    health: dict[HealthCheckName, HealthCheckConfig] = Field(
        default_factory=dict,
        description="Health checks by name (stages.health.HEALTH_CHECKS: non_finite, "
        "no_learning_signal, reward_all_equal, entropy_collapse, response_clipping, kl_blowup, "
        "weight_sync, first_step_agreement; docs/health.md), each {action, threshold}; every check runs with its defaults "
        "unless set here (section)",
    )
    plugins: list[str] = Field(
        default_factory=list,
        description="Modules imported before the config's registry names are checked (and in every Ray rank), so the estimators / losses they register are selectable by name (module names)",
    )
