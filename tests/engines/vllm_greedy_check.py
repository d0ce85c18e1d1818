"""A ``ppoflow.plugins`` module for tests: rollout backend ``vllm_greedy_checked``, the ``vllm``
entry with a check after every weight sync.

Each call first gets the actor's vLLM engine (``ActorWorker.vllm_rollout``: built on first use,
sent the actor's weights when an update changed them). When that call built or synced the engine,
the call's prompts are decoded greedily twice — by vLLM, and by HF ``generate`` on the actor's
own module — and one JSON line is appended to ``$PPOFLOW_GREEDY_CHECK_DIR/rank<r>.jsonl``:
``{"rank", "tensor_parallel_size", "executor", "rows", "equal", "vllm", "hf"}`` (the engine's
vLLM parallel settings). An actor with LoRA adapters is also decoded by HF with its adapters off
(the base model), recorded as ``"base"`` and ``"adapted"`` (whether the adapters changed a token). Then the rollout runs as ``vllm``'s does. Without
the environment variable the rollout raises, so a run meant to be checked cannot go unchecked.
The ranks of a Ray run import the module too (they find it on PYTHONPATH, and inherit the
variable from the driver that started Ray). Pytest does not collect it (tests/engines/conftest.py):
importing it registers the entry.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import torch

from stages.engines.adapters import adapters_off
from stages.engines.roles import on_host
from stages.engines.rollout_backends import ROLLOUT_BACKENDS

NAME = "vllm_greedy_checked"
LOG_DIR_VARIABLE = "PPOFLOW_GREEDY_CHECK_DIR"


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _generate(worker, prompts, settings):
    if not os.environ.get(LOG_DIR_VARIABLE):
        raise RuntimeError(f"rollout {NAME} needs {LOG_DIR_VARIABLE}: the directory of its log")
    log_dir = Path(os.environ[LOG_DIR_VARIABLE])
    vllm, hf = ROLLOUT_BACKENDS.get("vllm"), ROLLOUT_BACKENDS.get("hf")
    synced = worker.vllm is None or worker.vllm_is_stale
    engine = worker.vllm_rollout()
    if synced:
        greedy = replace(settings, do_sample=False, seed=None)
        by_vllm = engine.generate_sequences(on_host(prompts), greedy).batch["responses"]
        by_hf = hf.generate(worker, prompts, greedy).batch["responses"]
        parallel = engine.llm.llm_engine.vllm_config.parallel_config
        record = {
            "rank": _rank(),
            "tensor_parallel_size": parallel.tensor_parallel_size,
            "executor": str(parallel.distributed_executor_backend),
            "rows": len(prompts),
            "equal": bool(torch.equal(by_vllm, by_hf)),
            "vllm": by_vllm.tolist(),
            "hf": by_hf.tolist(),
        }
        if worker.adapter is not None:
            with adapters_off(worker.lm):
                by_base = hf.generate(worker, prompts, greedy).batch["responses"]
            record.update(base=by_base.tolist(), adapted=not torch.equal(by_hf, by_base))
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"rank{record['rank']}.jsonl", "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")
    return vllm.generate(worker, prompts, settings)


if NAME not in ROLLOUT_BACKENDS:
    ROLLOUT_BACKENDS.add(NAME, replace(ROLLOUT_BACKENDS.get("vllm"), generate=_generate))
