"""The GPU check's training part: `ppoflow train` end to end on one GPU, a checkpoint, a resume.

GRPO with a KL loss (verl's low_var_kl, coefficient 0.001) on a random-init model of
Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 query / 2 key-value heads, MLP 4864, 151,936
vocabulary rows; the demo's byte tokenizer), the demo task's prompts, HF rollouts (the static-cache
decode, eager unless --compiled-rollout), DeepSpeed ZeRO-2 in bf16, console and TensorBoard metrics (MLflow's wheel is too large to carry to the GPU
machine). `--steps` steps ending with a checkpoint, then `ppoflow resume` for `--steps` more.

Each step's metrics are read back from the run directory's step journals (step_N/journal.json)
and the report gives, per step: the stages' seconds (timing_s/*), rollout tokens/s (response
tokens ÷ timing_s/gen), the step's tokens/s (perf/throughput: prompt + response tokens ÷ step
seconds), the update's MFU (perf/mfu/actor) and the allocator's peak device memory
(actor/perf/max_memory_allocated_gb). A part that fails says so in the report, with the tail of
its log, and the parts after it are skipped with the reason.

    python bench/gpu_train.py --report FILE                 # on the GPU machine (bench/gpu_check.sh)
    python bench/gpu_train.py --report FILE --cpu-smoke     # the same path on the CPU, tiny model
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_check import QWEN_05B_CONFIG  # noqa: E402

#: Qwen2.5-0.5B's sizes as make_tiny_model's arguments (tied embeddings, as it builds them)
QWEN_05B_SHAPE = dict(
    hidden_size=QWEN_05B_CONFIG["hidden_size"],
    num_layers=QWEN_05B_CONFIG["num_hidden_layers"],
    num_heads=QWEN_05B_CONFIG["num_attention_heads"],
    num_kv_heads=QWEN_05B_CONFIG["num_key_value_heads"],
    intermediate_size=QWEN_05B_CONFIG["intermediate_size"],
    vocab_size=QWEN_05B_CONFIG["vocab_size"],
    max_position_embeddings=QWEN_05B_CONFIG["max_position_embeddings"],
)
#: the CPU smoke's model: the demo's, with the real vocabulary size (the largest tensor of a step)
SMOKE_SHAPE = dict(vocab_size=QWEN_05B_CONFIG["vocab_size"])
#: the report's name for the model, by --cpu-smoke
MODEL_NAME = {False: "Qwen2.5-0.5B's shape, random init, bf16", True: "the demo model (CPU smoke)"}
#: the report's name for the HF decode, by --compiled-rollout
ROLLOUT_NAME = {False: "rollout.enforce_eager: no CUDA graphs", True: "CUDA graphs"}
#: columns of the report's table: (heading, journal metric)
STAGE_COLUMNS = (
    ("gen s", "timing_s/gen"),
    ("ref s", "timing_s/ref"),
    ("update s", "timing_s/update_actor"),
    ("step s", "timing_s/step"),
)


def run_logged(command: list[str], log: Path, timeout: float) -> tuple[int, float, str]:
    """Run ``command`` from the repository root, its output into ``log`` (standard error into
    ``log`` + ``.err``); (exit status, wall seconds, last line of its standard output). A command
    past ``timeout`` is killed (status 124)."""
    start = time.perf_counter()
    with log.open("w") as out, log.with_suffix(log.suffix + ".err").open("w") as err:
        try:
            rc = subprocess.run(
                command, cwd=REPO, stdout=out, stderr=err, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return rc, time.perf_counter() - start, lines[-1] if lines else ""


def log_tail(log: Path, lines: int = 25) -> list[str]:
    """The last ``lines`` of a command's output and of its standard error, fenced."""
    tail = []
    for path in (log, log.with_suffix(log.suffix + ".err")):
        text = path.read_text(errors="replace").splitlines() if path.exists() else []
        tail += [f"--- {path.name}", *text[-lines:]]
    return ["```", *tail, "```"]


def train_overrides(work: Path, args: argparse.Namespace) -> list[str]:
    """configs/demo-cpu.yaml turned into the GPU run of the module docstring."""
    device, dtype = ("cpu", "float32") if args.cpu_smoke else ("cuda", "bfloat16")
    return [
        f"data.train_files=[{work / 'data' / 'train.parquet'}]",
        f"data.val_files=[{work / 'data' / 'val.parquet'}]",
        f"data.train_batch_size={args.rows}",
        f"data.max_response_length={args.response}",
        f"actor_rollout_ref.model.path={work / 'model'}",
        f"actor_rollout_ref.model.dtype={dtype}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={not args.cpu_smoke}",
        f"actor_rollout_ref.actor.zero_stage={0 if args.cpu_smoke else 2}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.rows}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.optim.lr=1.0e-6",
        "actor_rollout_ref.rollout.name=hf",
        # the static-cache decode without CUDA graphs: compiling a graph per batch size would
        # take much of the part's time limit (the rollout part of gpu_check.py times both)
        f"actor_rollout_ref.rollout.enforce_eager={not args.compiled_rollout}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.dtype={dtype}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.micro}",
        f"trainer.device={device}",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.save_freq={args.steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.log_val_generations=0",
        "trainer.resume_mode=disable",
        f"trainer.logger=[console{'' if args.no_tensorboard else ',tensorboard'}]",
        f"trainer.default_local_dir={work / 'checkpoints'}",
        f"ppoflow.artifact_dir={work / 'runs'}",
    ]


def step_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """Each finished step's metrics, from its journal."""
    steps = {}
    for journal in run_dir.glob("step_*/journal.json"):
        record = json.loads(journal.read_text())
        if record.get("status") == "done":
            steps[int(record["step"])] = record.get("metrics", {})
    return dict(sorted(steps.items()))


def rollout_tokens_per_s(metrics: dict[str, float], sequences: int) -> float | None:
    """Response tokens of the step's rollout ÷ its seconds."""
    seconds, mean_length = metrics.get("timing_s/gen"), metrics.get("response_length/mean")
    if not seconds or mean_length is None:
        return None
    return mean_length * sequences / seconds


def cell(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def metrics_table(
    steps: dict[int, dict[str, float]], sequences: int, resumed_from: int
) -> list[str]:
    head = ["step", *(name for name, _ in STAGE_COLUMNS), "rollout tok/s", "step tok/s"]
    head += ["MFU update", "peak alloc GiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for step, m in steps.items():
        mfu = m.get("perf/mfu/actor")
        row = [f"{step}{' (resumed)' if step == resumed_from + 1 else ''}"]
        row += [cell(m.get(key)) for _, key in STAGE_COLUMNS]
        row += [cell(rollout_tokens_per_s(m, sequences), 0), cell(m.get("perf/throughput"), 0)]
        row += ["–" if mfu is None else f"{100 * mfu:.1f} %"]
        row += [cell(m.get("actor/perf/max_memory_allocated_gb"))]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", type=Path, required=True, help="markdown file to append to")
    parser.add_argument("--steps", type=int, default=2, help="steps before the checkpoint")
    parser.add_argument("--rows", type=int, default=32, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument("--response", type=int, default=256, help="response tokens at most")
    parser.add_argument("--micro", type=int, default=32, help="rows per micro-batch")
    parser.add_argument("--timeout", type=float, default=200.0, help="seconds per ppoflow call")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model on the CPU")
    parser.add_argument(
        "--compiled-rollout",
        action="store_true",
        help="decode with CUDA graphs (rollout.enforce_eager=false); default: the eager loop",
    )
    parser.add_argument(
        "--no-tensorboard", action="store_true", help="console metrics only (no tensorboard)"
    )
    args = parser.parse_args()
    if args.cpu_smoke:
        args.rows, args.n, args.response, args.micro = 4, 2, 8, 8
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ppoflow-gpu-train-"))
    work.mkdir(parents=True, exist_ok=True)
    report = ["## Training: `ppoflow train` + `ppoflow resume` (bench/gpu_train.py)"]
    rc = run_parts(work, args, report)
    with args.report.open("a") as out:
        out.write("\n".join(report) + "\n")
    print("\n".join(report))
    return rc


def run_parts(work: Path, args: argparse.Namespace, report: list[str]) -> int:
    from stages.data.tiny_model import make_tiny_model

    start = time.perf_counter()
    shape = SMOKE_SHAPE if args.cpu_smoke else QWEN_05B_SHAPE
    make_tiny_model(work / "model", **shape)
    cli = [sys.executable, "-m", "flows.cli"]
    rc, _, _ = run_logged([*cli, "make-demo-data", str(work / "data")], work / "data.log", 120)
    if rc:
        report.append(f"- demo data: **failed** (exit {rc}); training skipped")
        return rc
    sequences = args.rows * args.n
    report.append(
        f"- model: {MODEL_NAME[args.cpu_smoke]},"
        f" vocabulary {shape['vocab_size']:,}; set up in {time.perf_counter() - start:.0f} s"
    )
    report.append(
        f"- run: GRPO + KL loss, {args.rows} prompts × n = {args.n} ({sequences} sequences) per step,"
        f" responses ≤ {args.response} tokens, micro-batches of {args.micro}, ZeRO-"
        f"{0 if args.cpu_smoke else 2}, HF rollouts ({ROLLOUT_NAME[args.compiled_rollout]})"
    )
    config = str(REPO / "configs" / "demo-cpu.yaml")
    train = [*cli, "train", config, *train_overrides(work, args)]
    rc, seconds, run_dir = run_logged(train, work / "train.log", args.timeout)
    if rc:
        report += [f"- train: **failed** (exit {rc}) after {seconds:.0f} s; resume skipped"]
        report += log_tail(work / "train.log")
        return rc
    report.append(
        f"- train: {args.steps} steps and the checkpoint in {seconds:.0f} s (start-up included)"
    )
    resume = [*cli, "resume", run_dir, f"trainer.total_training_steps={2 * args.steps}"]
    rc, seconds, _ = run_logged(resume, work / "resume.log", args.timeout)
    if rc:
        report += [f"- resume: **failed** (exit {rc}) after {seconds:.0f} s"]
        report += log_tail(work / "resume.log")
    else:
        report.append(f"- resume: {args.steps} more steps in {seconds:.0f} s (start-up included)")
    steps = step_metrics(Path(run_dir))
    expected = list(range(1, 1 + (args.steps if rc else 2 * args.steps)))
    if list(steps) != expected:
        report.append(f"- **steps in the run's journals: {list(steps)}, expected {expected}**")
        rc = rc or 1
    report += ["", *metrics_table(steps, sequences, resumed_from=args.steps)]
    return rc


if __name__ == "__main__":
    sys.exit(main())
