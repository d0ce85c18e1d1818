"""Rollout correction on deliberately mismatched runs: the mismatch metrics rise with the gap
between the rollout's and the trainer's log-probs, and truncated importance sampling keeps the
update bounded.

    OMP_NUM_THREADS=1 flock /tmp/ppoflow-train.lock .venv/bin/python bench/rollout_mismatch.py \
        [--steps 40] [--sources 'async, T = 8;async, T = 8, partial'] [--corrections none]

configs/demo-cpu.yaml (GRPO, 64 prompts × 4, the tiny model, HF rollouts) with
``algorithm.rollout_correction.bypass_mode=false`` everywhere, so the trainer recomputes the old
log-probs and the rollout_correction stage measures the gap to the rollout's. Sources of
mismatch, from none to the most:

- **matched**: on policy; the rollout's log-probs are the actor's own (rounding only);
- **one step off**: ``ppoflow.schedule=one_step_off``: batches from θ_{k−2}, trained from θ_{k−1};
- **async, T = 4**: ``ppoflow.schedule=fully_async`` with ``trigger_parameter_sync_step=4``,
  ``staleness_threshold=0.1``: batches up to 7 updates old;
- **async, T = 8**: ``trigger_parameter_sync_step=8``, ``staleness_threshold=1``: 16 batches
  ahead, up to 23 updates old;
- **… partial**: the async sources with partial rollouts (``partial_rollout=true``): each sync
  cuts the batches in flight, whose later tokens come from the newer weights (the async sources
  above generate whole batches, ``partial_rollout=false``).

``--sources`` picks some by name (separated by ``;``, as the names hold commas; default all),
``--corrections`` likewise.

each without correction and with ``rollout_is=token`` (weights truncated at
``rollout_is_threshold`` = 2). Per run, over its steps: the mean of ``rollout_corr/k3_kl`` and of
``rollout_corr/log_ppl_abs_diff``, the mean share of token weights the truncation cut
(``rollout_corr/rollout_is_ratio_fraction_high``), the largest |``actor/pg_loss``| and
``actor/grad_norm``, and the last greedy validation score. One run each, one after the other; the load average is printed at the
start and the end. Record the figures in bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
from pathlib import Path

from demo_runs import make_demo, train_demo

VALIDATION = re.compile(r"validation @ step (\d+): score (-?[0-9.]+)")
SOURCES = {
    "matched": [],
    "one step off": ["ppoflow.schedule=one_step_off"],
    "async, T = 4": [
        "ppoflow.schedule=fully_async",
        "async_training.trigger_parameter_sync_step=4",
        "async_training.staleness_threshold=0.1",
        "async_training.partial_rollout=false",  # as recorded: one version per batch
    ],
    "async, T = 8": [
        "ppoflow.schedule=fully_async",
        "async_training.trigger_parameter_sync_step=8",
        "async_training.staleness_threshold=1",
        "async_training.partial_rollout=false",
    ],
}
for _whole in ("async, T = 4", "async, T = 8"):
    SOURCES[f"{_whole}, partial"] = [
        *(o for o in SOURCES[_whole] if not o.startswith("async_training.partial_rollout")),
        "async_training.partial_rollout=true",
    ]
CORRECTIONS = {
    "none": [],
    "token IS ≤ 2": [
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0",
    ],
}


def run(root: Path, name: str, extra: list[str], args, env) -> tuple[float, list[dict]]:
    """One training: (its last validation score, each step's metrics)."""
    extra = [
        "algorithm.rollout_correction.bypass_mode=false",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.steps}",
        *extra,
    ]
    out, steps = train_demo(root, name, "configs/demo-cpu.yaml", extra, env)
    return float(VALIDATION.findall(out)[-1][1]), steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sources", default=";".join(SOURCES))
    parser.add_argument("--corrections", default=";".join(CORRECTIONS))
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    print(f"load average at start: {os.getloadavg()}")
    print(
        f"{'mismatch':>22} {'correction':>13} {'k3 kl':>9} {'|Δlog ppl|':>10} "
        f"{'cut':>8} {'max |pg_loss|':>13} {'max grad_norm':>13} {'val':>6}"
    )
    with tempfile.TemporaryDirectory(prefix="rollout-mismatch-") as tmp:
        root = Path(tmp)
        make_demo(root, env)
        for source in args.sources.split(";"):
            source_overrides = SOURCES[source]
            for correction in args.corrections.split(";"):
                correction_overrides = CORRECTIONS[correction]
                name = re.sub(r"[^A-Za-z0-9]+", "_", f"{source}-{correction}")
                score, steps = run(root, name, source_overrides + correction_overrides, args, env)
                kl = statistics.fmean(m["rollout_corr/k3_kl"] for m in steps)
                ppl = statistics.fmean(m["rollout_corr/log_ppl_abs_diff"] for m in steps)
                cut = statistics.fmean(
                    m.get("rollout_corr/rollout_is_ratio_fraction_high", 0.0) for m in steps
                )
                loss = max(abs(m["actor/pg_loss"]) for m in steps)
                grad = max(m["actor/grad_norm"] for m in steps)
                is_text = f"{cut:>8.2%}" if correction != "none" else f"{'-':>8}"
                print(
                    f"{source:>22} {correction:>13} {kl:>9.2e} {ppl:>10.2e} {is_text} "
                    f"{loss:>13.4f} {grad:>13.4f} {score:>6.3f}"
                )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
