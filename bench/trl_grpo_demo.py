"""TRL's GRPOTrainer on ppoflow's demo work: the baseline side of bench/vs_trl.py.

    .venv-bench/bin/python bench/trl_grpo_demo.py --model DIR --data FILE --steps N --out FILE
        [--samples 4] [--completions 256] [--micro 16] [--max-tokens 16] [--threads 2]
    .venv-bench/bin/torchrun --standalone --nproc-per-node=2 bench/trl_grpo_demo.py … --threads 1

Run in the bench environment (``make bench-trl-env``: TRL 1.16 and the same transformers and
torch as ppoflow's environment); ppoflow is not imported, only the demo task's scorer
(``stages/data/demo_task.py``, standard library only) is loaded from its file. The work matches
``configs/demo-cpu.yaml`` as bench/vs_trl.py runs it (the defaults; bench/vs_trl.py's
``--size compute`` passes its own): 64 prompts × 4 samples per step (256 completions of at most
16 tokens, temperature 1), one optimizer step per generation round in 16 micro-batches of 16
(gradient accumulation), AdamW at lr 3e-4 with verl's defaults
(betas 0.9 / 0.999, weight decay 0.01, gradient clip 1.0, constant lr), no KL (β 0), group-std
scaled advantages, token-mean loss (TRL's ``dapo``), clip ε 0.2, fp32, CPU.

``--out`` receives one JSON line per optimizer step, ``{"step": k, "wall": time.time()}`` at
its end, and a last line with the process's peak RSS (``ru_maxrss``, KiB). Under ``torchrun``
(data-parallel processes, gloo on CPU, Accelerate reads the launcher's environment) each of the
W processes generates and trains on completions / W per step; process 0 writes ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import time
from pathlib import Path

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

REPO = Path(__file__).resolve().parents[1]
#: this process's rank and the number of processes (torchrun's environment; 0 and 1 without it)
WORLD_RANK = int(os.environ.get("RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))


def demo_scorer():
    """The demo task's ``compute_score``, loaded from its file (no ppoflow package import)."""
    spec = importlib.util.spec_from_file_location(
        "demo_task", REPO / "stages" / "data" / "demo_task.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DEMO = demo_scorer()


def demo_reward(prompts, completions, reward_model, data_source, extra_info, **_):
    """TRL reward function: the demo scorer's ``score`` for each completion."""
    scores = []
    for completion, truth, source, extra in zip(
        completions, reward_model, data_source, extra_info, strict=True
    ):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        scores.append(DEMO.compute_score(source, text, truth["ground_truth"], extra)["score"])
    return scores


class StepTimes(TrainerCallback):
    """Appends ``{"step": k, "wall": …}`` to ``path`` at the end of each optimizer step (process
    0 only)."""

    def __init__(self, path: Path) -> None:
        self.out = path.open("w") if WORLD_RANK == 0 else None

    def on_step_end(self, args, state, control, **kwargs):
        if self.out is not None:
            self.out.write(json.dumps({"step": state.global_step, "wall": time.time()}) + "\n")
            self.out.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="the demo train.parquet")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--completions", type=int, default=256, help="completions per step")
    parser.add_argument("--micro", type=int, default=16, help="completions per micro-batch")
    parser.add_argument("--max-tokens", type=int, default=16, help="max completion tokens")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    args = parser.parse_args()
    if args.completions % (args.micro * WORLD_SIZE) or args.completions % args.samples:
        parser.error(
            "--completions must be a multiple of --samples and of --micro × the process count "
            f"({args.micro} × {WORLD_SIZE})"
        )
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    dataset = load_dataset("parquet", data_files=args.data, split="train")
    config = GRPOConfig(
        output_dir=str(Path(args.out).parent / "trl-output"),
        per_device_train_batch_size=args.micro,
        # one optimizer step per generation round of `completions`, over all processes
        gradient_accumulation_steps=args.completions // (args.micro * WORLD_SIZE),
        num_generations=args.samples,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        num_iterations=1,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",  # token-mean over the accumulated batch, verl's token-mean
        scale_rewards="group",
        learning_rate=3e-4,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        max_steps=args.steps,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=args.seed,
        dataloader_num_workers=0,
    )
    times = StepTimes(Path(args.out))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=demo_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[times],
    )
    trainer.train()
    if times.out is not None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        times.out.write(json.dumps({"peak_rss_kib": peak}) + "\n")
        times.out.close()


if __name__ == "__main__":
    main()
