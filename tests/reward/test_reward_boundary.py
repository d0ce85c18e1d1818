"""The reward boundary (issue 36): what crosses it is plain data, a worker's memory and output
are bounded, and no scorer process can stall or outlive the run.

1. Results cross as JSON plain data, checked in the worker; the driver decodes with a size
   bound and never unpickles or runs anything a worker sends (a hostile worker that writes its
   own frames included). Samples cross the same way.
2. ``reward.worker_memory_mb`` bounds each worker's address space; ``reward.worker_output_bytes``
   bounds the scorer output passed on to the run's log per batch.
3. A zygote killed with its workers is restarted once per call and the batch re-scored; a second
   death in the call, or a failed restart, is one line; a killed driver takes every scorer
   process with it.

The scorers (``boundary_scorers.py``) are named by file path and never imported here. No test
asserts a wall time; ``timeout`` marks only keep a broken implementation from hanging the suite.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dataproto.nontensor_codec import SUPPORTED as CODEC_SUPPORTED
from dataproto.nontensor_codec import decode_value, encode_value
from stages.reward import wire
from stages.reward.custom import scorer_ref
from stages.reward.loop import RewardLoop
from stages.reward.pool import ScorerPool
from stages.reward.settings import RewardSettings
from stages.reward.zygote import ScorerProcessError

BOUNDARY = Path(__file__).with_name("boundary_scorers.py")
REPO = Path(__file__).resolve().parents[2]


def attack_pool(**kwargs) -> ScorerPool:
    kwargs.setdefault("num_workers", 1)
    kwargs.setdefault("startup_timeout_s", 30.0)
    return ScorerPool(scorer_ref(BOUNDARY, kwargs.pop("name", "attack")), **kwargs)


def calls_for(solutions: list[str]) -> list[dict]:
    return [
        {"data_source": "test/source", "solution_str": s, "ground_truth": "", "extra_info": None}
        for s in solutions
    ]


def state_of(pid: int) -> str | None:
    """The process state letter (``Z`` for a zombie), or None when the pid is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def exited(pid: int) -> bool:
    return state_of(pid) in (None, "Z", "X")


def wait_until(predicate, bound_s: float) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# --- 1. plain data, both ways ----------------------------------------------------------------

#: values the artifact stores, each with its type kept exactly
PLAIN = [
    None,
    True,
    0,
    -(2**70),
    1.5,
    -0.0,
    math.nan,
    math.inf,
    -math.inf,
    "",
    "é\udc80",  # a lone surrogate round-trips
    [1, [2.0, None]],
    (1, (2, "x")),
    {"a": {"b": [1, (2,)]}},
    {1: "int key", (1, 2): "tuple key", None: 0},
    {"$float": "a plain dict that looks like a tag"},
    np.float32(0.5),
    np.int64(-3),
    np.bool_(True),
    np.str_("s"),
    np.uint8(255),
    np.arange(6).reshape(2, 3),
    np.array([1.0, math.nan]),
    np.array([True, False]),
    np.array([{"a": 1}, [2], None], dtype=object),
]


def same(a, b) -> bool:
    """Equal, with the same types all the way down (NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and all(map(same, a.ravel(), b.ravel()))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (float, np.floating)):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    return a == b


@pytest.mark.parametrize("value", PLAIN, ids=lambda v: type(v).__name__)
def test_the_wire_encoding_is_the_artifact_encoding_and_keeps_types(value):
    assert wire.to_plain(value) == encode_value(value)
    assert same(wire.from_plain(encode_value(value)), decode_value(encode_value(value)))
    assert json.dumps(wire.to_plain(value), allow_nan=False)  # JSON without NaN literals
    assert same(wire.from_plain(wire.loads(wire.dumps(wire.to_plain(value)))), value)
    assert wire.SUPPORTED == CODEC_SUPPORTED


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"$np": ["V999999999", 0]}, "not one of the plain numpy dtypes"),
        ({"$ndarray": ["U999999999", [1], ["x"]]}, "not one of the plain numpy dtypes"),
        ({"$ndarray": ["int64", [1000000, 1000000], [1]]}, "does not hold the values given"),
        ({"$ndarray": ["int64", [-1], []]}, "is not a list of sizes"),
        ({"$np": ["int8", 1000]}, "is not a int8"),
        ({"$float": "1e999"}, "is not nan, inf or -inf"),
        ({"$dict": [[[1], "list key"]]}, "key is not hashable"),
        ({"$tuple": "abc"}, "not a list"),
    ],
)
def test_plain_data_from_a_worker_is_decoded_strictly(data, why):
    with pytest.raises(ValueError, match=why):
        wire.from_plain(data)


def test_json_non_finite_literals_are_refused():
    with pytest.raises(ValueError, match="NaN is not plain data"):
        wire.loads(b"[1, NaN]")


@pytest.fixture(scope="module")
def attack_loop():
    settings = RewardSettings(num_workers=2, timeout_s=0.5, error_score=-1.0)
    with RewardLoop(None, settings, scorer=scorer_ref(BOUNDARY, "attack")) as loop:
        yield loop


@pytest.mark.timeout(60)
def test_a_result_whose_reduce_sleeps_is_invalid_and_never_reaches_the_driver(attack_loop, caplog):
    solutions = ["1", "reduce_extra", "reduce_result", "float_extra", "float_result", "2"]
    uids = [f"u{i}" for i in range(len(solutions))]
    with caplog.at_level(logging.WARNING, logger="stages.reward.loop"):
        result = attack_loop.score_calls(calls_for(solutions), uids)
    assert [o.status for o in result.outcomes] == [
        "ok",
        "invalid",
        "invalid",
        "invalid",
        "ok",
        "ok",
    ]
    assert result.counts == {"error": 0, "timeout": 0, "invalid": 3}
    assert result.scores.tolist() == [1.0, -1.0, -1.0, -1.0, 2.5, 2.0]
    name = "ppoflow_custom_reward_boundary_scorers_"
    messages = [o.message for o in result.outcomes]
    assert f"extra 'trap' is a {name}" in messages[1] and ".SlowReduce" in messages[1]
    assert "could not be read back in the driver unless it is plain data" in messages[1]
    assert "returned SlowReduce" in messages[2]
    assert ".SlowFloat" in messages[3]
    assert result.extras["acc"].tolist()[4] == 2.5 and type(result.extras["acc"][4]) is float
    assert sum("uid=u1 " in r.getMessage() for r in caplog.records) == 1


def test_nothing_a_worker_sends_is_unpickled(monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError("the driver unpickled something")

    scorer = tmp_path / "returns_everything.py"
    scorer.write_text(
        "import math\nimport numpy as np\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': np.float64(0.25), 'nested': {'a': (1, [None, math.nan]), 2: 'k'},\n"
        "            'arr': np.arange(4, dtype=np.int32).reshape(2, 2), 'flag': True,\n"
        "            'seen': extra_info}\n"
    )
    extra_info = {"index": 3, "tags": ("a", "b"), "vec": np.array([0.5, 1.5])}
    calls = [{**calls_for(["x"])[0], "extra_info": extra_info}]
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    with ScorerPool(scorer_ref(scorer), num_workers=1) as pool:
        (outcome,) = pool.map(calls, timeout_s=30.0)
    assert outcome.status == "ok" and outcome.score == 0.25
    extras = outcome.extras
    assert same(extras["score"], np.float64(0.25))
    assert same(extras["nested"], {"a": (1, [None, math.nan]), 2: "k"})
    assert same(extras["arr"], np.arange(4, dtype=np.int32).reshape(2, 2))
    assert extras["flag"] is True
    assert same(extras["seen"], extra_info)  # the sample reached the scorer with its types


def test_a_sample_that_is_not_plain_data_fails_alone():
    calls = calls_for(["1", "2"])
    calls[1]["extra_info"] = {"raw": b"bytes"}
    with attack_pool() as pool:
        first, second = pool.map(calls, timeout_s=30.0)
    assert (first.status, first.score) == ("ok", 1.0)
    assert second.status == "error"
    assert (
        "sample could not be sent to the scorer worker: ['extra_info']['raw'] is a builtins.bytes"
        in second.message
    )


@pytest.mark.timeout(60)
def test_a_worker_that_forges_frames_fails_only_its_sample_and_never_stalls_the_driver():
    with attack_pool(num_workers=1) as pool:
        outcomes = pool.map(
            calls_for(["huge_frame", "1", "garbage_frame", "2", "partial_frame", "3"]),
            timeout_s=0.5,
        )
    statuses = [o.status for o in outcomes]
    assert statuses == ["error", "ok", "error", "ok", "timeout", "ok"]
    assert [o.score for o in outcomes if o.status == "ok"] == [1.0, 2.0, 3.0]
    assert "the worker sent a message of 4294967295 bytes, over the" in outcomes[0].message
    assert "the worker sent a malformed message (UnicodeDecodeError" in outcomes[2].message
    assert "worker killed and replaced" in outcomes[2].message
    assert pool.restarts == 3


@pytest.mark.timeout(60)
def test_a_forged_result_is_refused_and_a_worker_hiding_its_progress_is_still_timed_out():
    with attack_pool(num_workers=1) as pool:
        forged, hidden, after = pool.map(calls_for(["forged:0", "1", "2"]), timeout_s=0.2)
    assert forged.status == "invalid"
    assert "does not accept (ValueError: $np: dtype 'V999999999'" in forged.message
    assert (
        hidden.status == "timeout" and "while its worker showed no task running" in hidden.message
    )
    assert (after.status, after.score) == ("ok", 2.0)


def test_a_result_over_the_size_bound_is_invalid():
    with attack_pool() as pool:
        small, big = pool.map(
            calls_for(["big_result:1000", f"big_result:{wire.MAX_RESULT_BYTES}"]), 30.0
        )
    assert small.status == "ok" and len(small.extras["blob"]) == 1000
    assert big.status == "invalid"
    assert f"over the {wire.MAX_RESULT_BYTES}-byte bound on one sample's result" in big.message


# --- 2. memory and output bounds -------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_worker_past_its_memory_limit_is_an_error_and_a_fresh_worker():
    with attack_pool(num_workers=1, memory_mb=200) as pool:
        first = pool.worker_pids
        outcomes = pool.map(calls_for(["alloc:50", "alloc:400", "3"]), timeout_s=30.0)
        assert [o.status for o in outcomes] == ["ok", "error", "ok"]
        assert [outcomes[0].score, outcomes[2].score] == [50.0, 3.0]
        message = outcomes[1].message
        assert message.startswith("raised MemoryError") and "boundary_scorers.py" in message
        assert "memory limit (reward.worker_memory_mb = 200 MiB" in message
        assert pool.restarts == 1 and pool.worker_pids != first
    with attack_pool(num_workers=1, memory_mb=None) as pool:  # null: no bound
        (unbounded,) = pool.map(calls_for(["alloc:400"]), timeout_s=30.0)
    assert (unbounded.status, unbounded.score) == ("ok", 400.0)


def test_the_default_memory_limit_leaves_a_numpy_scorer_alone():
    assert RewardSettings().worker_memory_mb == 4096
    with attack_pool(name="numpy_scorer", memory_mb=RewardSettings().worker_memory_mb) as pool:
        outcomes = pool.map(calls_for(["a", "b"]), timeout_s=60.0)
    assert [o.status for o in outcomes] == ["ok", "ok"]
    assert same(outcomes[0].extras["score"], np.float32(1.0))
    assert same(outcomes[0].extras["row"], np.arange(3))


def test_scorer_output_past_the_cap_is_dropped_counted_and_noted(capfd, caplog):
    settings = RewardSettings(num_workers=2, timeout_s=30.0, worker_output_bytes=10_000)
    per_sample = 200_000  # printed to stdout, and as many bytes written to fd 2
    with RewardLoop(None, settings, scorer=scorer_ref(BOUNDARY, "attack")) as loop:
        capfd.readouterr()
        with caplog.at_level(logging.WARNING, logger="stages.reward.loop"):
            result = loop.score_calls(calls_for([f"print:{per_sample}"] * 3 + ["4"]), list("abcd"))
        assert result.scores.tolist() == [1.0, 1.0, 1.0, 4.0]
        captured = capfd.readouterr()
        assert result.output_dropped_bytes == 3 * 2 * per_sample - 10_000
        assert loop.pool.output_dropped_total == result.output_dropped_bytes
        note = (
            "\n[ppoflow] reward scorer output past reward.worker_output_bytes=10000 bytes in this "
            "batch is dropped (counted)\n"
        )
        assert captured.err.count(note) == 1
        scorer_err = captured.err.replace(note, "")
        assert set(captured.out) <= {"p", "\n"} and set(scorer_err) <= {"w"}
        assert len(captured.out) + len(scorer_err) == 10_000  # what passed: exactly the cap
        (line,) = [r.getMessage() for r in caplog.records]
        assert "printed more than reward.worker_output_bytes=10000 bytes" in line
        assert f"{result.output_dropped_bytes} bytes of its output were dropped" in line
        again = loop.score_calls(calls_for(["print:1000"]), ["e"])  # a new batch, a new budget
    assert again.output_dropped_bytes == 0


@pytest.mark.timeout(60)
def test_a_scorer_thread_that_keeps_printing_cannot_hold_a_call(capfd):
    import fcntl
    import struct
    import termios

    def waiting_bytes(fd: int) -> int:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]

    with attack_pool(num_workers=1, output_bytes=1000) as pool:
        assert [o.score for o in pool.map(calls_for(["chatter"]), timeout_s=30.0)] == [1.0]
        stdout_pipe = pool._state.output.read_fds[0]
        assert wait_until(lambda: waiting_bytes(stdout_pipe) >= 4096, 10.0)  # it still writes
        assert [o.score for o in pool.map(calls_for(["2", "3"]), timeout_s=30.0)] == [2.0, 3.0]
        assert pool.output_dropped > 0
    assert capfd.readouterr().out.count("c") <= 2 * 1000  # at most the cap, per call


def test_the_new_keys_come_from_the_config_and_are_checked():
    from stages.config import ConfigError, load_config
    from stages.reward.settings import CONFIG_KEYS, settings_from_config

    base = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]
    overrides = ["reward.worker_memory_mb=512", "reward.worker_output_bytes=0", *base]
    settings = settings_from_config(load_config(None, overrides))
    assert (settings.worker_memory_mb, settings.worker_output_bytes) == (512, 0)
    unbounded = ["reward.worker_memory_mb=null", "reward.worker_output_bytes=null", *base]
    settings = settings_from_config(load_config(None, unbounded))
    assert (settings.worker_memory_mb, settings.worker_output_bytes) == (None, None)
    defaults = settings_from_config(load_config(None, base))
    assert (defaults.worker_memory_mb, defaults.worker_output_bytes) == (4096, 1 << 20)
    for bad, expected in [
        ("reward.worker_memory_mb=0", "reward.worker_memory_mb: got 0; must be ≥ 1"),
        (
            "reward.worker_memory_mb=lots",
            "reward.worker_memory_mb: got 'lots' (str); expected an integer",
        ),
        ("reward.worker_output_bytes=-1", "reward.worker_output_bytes: got -1; must be ≥ 0"),
    ]:
        with pytest.raises(ConfigError) as info:
            load_config(None, [bad, *base])
        problems = [line for line in str(info.value).splitlines() if line.startswith("  - ")]
        assert problems == [f"  - {expected}"]
    with pytest.raises(ValueError, match=r"reward.worker_memory_mb must be >= 1 MiB or None"):
        RewardSettings(worker_memory_mb=0)
    with pytest.raises(ValueError, match=r"reward.worker_output_bytes must be >= 0 bytes or None"):
        RewardSettings(worker_output_bytes=-5)
    assert "reward.worker_memory_mb" in CONFIG_KEYS  # it can change a sample's score
    assert "reward.worker_output_bytes" not in CONFIG_KEYS  # it only bounds the log


# --- 3. the zygote's death, and the driver's ------------------------------------------------


@pytest.mark.timeout(60)
def test_a_zygote_killed_with_its_worker_mid_call_is_restarted_and_the_batch_rescored(
    tmp_path, caplog
):
    marker = tmp_path / "killed-once"
    solutions = (
        [str(i) for i in range(6)] + [f"kill_zygote_once:{marker}"] + [str(i) for i in range(6, 12)]
    )
    with attack_pool(num_workers=2) as pool:
        old = pool.zygote_pid
        with caplog.at_level(logging.WARNING, logger="stages.reward.pool"):
            outcomes = pool.map(calls_for(solutions), timeout_s=30.0)
        assert marker.exists()  # the kill happened, in the middle of this call
        (line,) = [r.getMessage() for r in caplog.records]
        assert f"reward scorer process of {BOUNDARY}:attack (zygote pid {old}) exited" in line
        assert [o.status for o in outcomes] == ["ok"] * 13
        assert [o.score for o in outcomes] == [float(i) for i in range(6)] + [5.0] + [
            float(i) for i in range(6, 12)
        ]
        assert pool.zygote_restarts == 1 and pool.zygote_pid != old
        assert exited(old)


@pytest.mark.timeout(60)
def test_a_zygote_and_workers_killed_from_outside_mid_call_are_replaced(tmp_path):
    with attack_pool(num_workers=2) as pool:
        old_zygote, old_workers = pool.zygote_pid, pool.worker_pids

        def kill_when_busy():
            wait_until(lambda: all(w.running() for w in list(pool._workers)), 20.0)
            for pid in (old_zygote, *old_workers):  # the probe's order: kill -9 ZYGOTE WORKER…
                os.kill(pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        outcomes = pool.map(calls_for(["sleep:0.3"] * 4 + ["7"]), timeout_s=30.0)
        killer.join()
        assert [(o.status, o.score) for o in outcomes] == [("ok", 0.3)] * 4 + [("ok", 7.0)]
        assert pool.zygote_restarts == 1
        assert not set(pool.worker_pids) & set(old_workers)


@pytest.mark.timeout(60)
def test_a_zygote_killed_while_idle_does_not_hang_the_next_call():
    with attack_pool(num_workers=1) as pool:
        assert [o.score for o in pool.map(calls_for(["1"]), timeout_s=None)] == [1.0]
        for pid in (pool.zygote_pid, *pool.worker_pids):
            os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: all(map(exited, pool.worker_pids)), 10.0)
        outcomes = pool.map(calls_for(["2", "3"]), timeout_s=None)  # no timeout to wake it
        assert [(o.status, o.score) for o in outcomes] == [("ok", 2.0), ("ok", 3.0)]
        assert pool.zygote_restarts == 1


def stop(*pids: int) -> None:
    """SIGSTOP each pid and wait until each is stopped."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    assert wait_until(lambda: all(state_of(pid) == "T" for pid in pids), 10.0), pids


@pytest.mark.timeout(60)
def test_a_worker_stopped_from_outside_is_replaced_and_its_samples_scored_again(caplog):
    """A SIGSTOPped worker ran no scorer code: at the deadline it is replaced and its samples
    are scored again, none timed out (a fault grid cell, tests/flows/test_fault_grid.py)."""
    with attack_pool(num_workers=1) as pool:
        (old,) = pool.worker_pids
        stop(old)
        with caplog.at_level(logging.WARNING, logger="stages.reward.pool"):
            outcomes = pool.map(calls_for(["1", "2"]), timeout_s=0.5)
        assert [(o.status, o.score) for o in outcomes] == [("ok", 1.0), ("ok", 2.0)]
        (line,) = [r.getMessage() for r in caplog.records]
        assert f"reward scorer worker (pid {old}) of {BOUNDARY}:attack is stopped (SIGSTOP)" in line
        assert "its 2 sample(s) scored again" in line
        assert (pool.restarts, pool.zygote_restarts) == (1, 0)
        assert wait_until(lambda: exited(old), 10.0)


@pytest.mark.timeout(60)
def test_a_zygote_stopped_with_its_workers_is_replaced_and_the_batch_rescored(caplog):
    """The zygote stopped too: it is not asked to fork (it would never answer) but replaced,
    once in the call, and killed with its workers; every sample scores as if nothing happened."""
    with attack_pool(num_workers=2) as pool:
        old = (pool.zygote_pid, *pool.worker_pids)
        stop(*old)
        with caplog.at_level(logging.WARNING, logger="stages.reward.pool"):
            outcomes = pool.map(calls_for([str(i) for i in range(6)]), timeout_s=0.5)
        assert [(o.status, o.score) for o in outcomes] == [("ok", float(i)) for i in range(6)]
        lines = [r.getMessage() for r in caplog.records]
        assert any(
            f"(zygote pid {old[0]}) is stopped (SIGSTOP); starting it again" in line
            for line in lines
        ), lines
        assert pool.zygote_restarts == 1 and pool.zygote_pid != old[0]
        assert wait_until(lambda: all(map(exited, old)), 10.0)


@pytest.mark.timeout(60)
def test_a_scorer_that_stops_itself_each_time_is_timed_out_in_the_end(caplog):
    """Replacing stopped workers is bounded per call (num_workers + 2): a scorer that stops its
    own worker every time gets ``timeout``, never an endless loop; the next call is served."""
    with attack_pool(num_workers=1) as pool:
        with caplog.at_level(logging.WARNING, logger="stages.reward.pool"):
            (outcome,) = pool.map(calls_for(["stop_self"]), timeout_s=0.3)
        assert outcome.status == "timeout", outcome
        stopped = [r for r in caplog.records if "is stopped (SIGSTOP)" in r.getMessage()]
        assert len(stopped) == 3 and pool.restarts == 4
        assert [o.score for o in pool.map(calls_for(["4"]), timeout_s=5.0)] == [4.0]


@pytest.mark.timeout(60)
def test_a_zygote_that_dies_again_in_the_same_call_is_one_clear_error():
    with attack_pool(num_workers=2) as pool:
        with pytest.raises(ScorerProcessError) as info:
            pool.map(calls_for(["1", "kill_zygote", "2"]), timeout_s=30.0)
        message = str(info.value)
        assert "\n" not in message
        assert f"reward scorer process of {BOUNDARY}:attack (zygote pid" in message
        assert "exited again while this batch was scored, after one restart" in message
        assert "reward.worker_memory_mb" in message
        assert pool.zygote_restarts == 1
        assert [o.score for o in pool.map(calls_for(["4"]), timeout_s=30.0)] == [4.0]  # next call


@pytest.mark.timeout(60)
def test_a_restart_that_fails_is_one_line_naming_the_process_and_the_key(tmp_path):
    scorer = tmp_path / "imports_once.py"
    scorer.write_text(
        "import os\n"
        f"MARKER = {str(tmp_path / 'imported')!r}\n"
        "if os.path.exists(MARKER):\n"
        "    raise RuntimeError('the second import fails')\n"
        "open(MARKER, 'w').close()\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0\n"
    )
    with ScorerPool(scorer_ref(scorer), num_workers=1, startup_timeout_s=30.0) as pool:
        os.kill(pool.zygote_pid, signal.SIGKILL)
        pool._state.zygote.process.wait()  # dead before the call (its worker may outlive it briefly)
        with pytest.raises(ScorerProcessError) as info:
            pool.map(calls_for(["x"]), timeout_s=30.0)
    message = str(info.value)
    assert "\n" not in message
    assert f"reward scorer process of {scorer}:compute_score (zygote pid" in message
    assert "could not be started again under reward.startup_timeout_s" in message
    assert "RuntimeError: the second import fails" in message


PARENT = """
import json, os, sys, time
sys.path[:0] = {paths!r}
from stages.reward.custom import scorer_ref
from stages.reward.pool import ScorerPool

mode = sys.argv[1]
pool = ScorerPool(scorer_ref({scorer!r}, "attack"), num_workers=2, startup_timeout_s=600.0)
child = None
if mode == "forked_child":  # a child forked after the pool holds the zygote's socket open
    child = os.fork()
    if child == 0:
        time.sleep(3600)
        os._exit(0)
pids = {{"zygote": pool.zygote_pid, "workers": pool.worker_pids, "child": child}}
print(json.dumps(pids), flush=True)
pool.map([dict(data_source="t", solution_str="sleep:3600", ground_truth="")] * 2, timeout_s=None)
"""

PARENT_IMPORT_HANG = """
import json, os, sys, threading, time
sys.path[:0] = {paths!r}
from stages.reward.custom import scorer_ref
from stages.reward.pool import ScorerPool

def zygotes():
    found = []
    for p in os.listdir("/proc"):
        try:
            cmdline = open(f"/proc/{{p}}/cmdline", "rb").read()
            parent = open(f"/proc/{{p}}/stat").read().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if b"stages.reward.zygote" in cmdline and parent == str(os.getpid()):
            found.append(int(p))
    return found

def report():
    while not zygotes():
        time.sleep(0.05)
    time.sleep(0.5)  # into the hung import
    print(json.dumps({{"zygote": zygotes()[0], "workers": [], "child": None}}), flush=True)

threading.Thread(target=report, daemon=True).start()
ScorerPool(scorer_ref({scorer!r}), num_workers=1, startup_timeout_s=600.0)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["plain", "forked_child", "with_its_zygote", "import_hangs"])
def test_no_scorer_process_outlives_a_killed_driver(tmp_path, mode):
    """SIGKILL the driver (a parent process running a pool whose workers are inside hung calls):
    the zygote and the workers exit. ``forked_child``: a process the driver forked holds the
    zygote's socket open (no end of file comes); ``with_its_zygote``: the zygote is SIGKILLed
    too, so only the workers' own parent-death signal can end them; ``import_hangs``: the driver
    dies while the scorer's import hangs."""
    paths = [str(REPO)]
    if mode == "import_hangs":
        hangs = tmp_path / "hangs.py"
        hangs.write_text(
            "import time\ntime.sleep(3600)\n\ndef compute_score(**kw):\n    return 1\n"
        )
        source = PARENT_IMPORT_HANG.format(paths=paths, scorer=str(hangs))
    else:
        source = PARENT.format(paths=paths, scorer=str(BOUNDARY))
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(source), mode], stdout=subprocess.PIPE, text=True
    )
    pids = {"child": None}
    try:
        pids = json.loads(parent.stdout.readline())
        scorer_pids = [pids["zygote"], *pids["workers"]]
        assert all(not exited(pid) for pid in scorer_pids)
        time.sleep(0.3)  # the workers are inside their (hung) calls, or the zygote in its import
        if mode == "with_its_zygote":
            os.kill(pids["zygote"], signal.SIGKILL)
        parent.kill()
        parent.wait()
        assert wait_until(lambda: all(map(exited, scorer_pids)), 10.0), [
            (pid, state_of(pid)) for pid in scorer_pids
        ]
    finally:
        parent.kill()
        parent.wait()
        if pids["child"] is not None:  # the sleeping child the parent forked
            os.kill(pids["child"], signal.SIGKILL)


def test_the_pool_works_when_the_driver_holds_more_than_1024_descriptors():
    """A trainer holds many descriptors (models, sockets, Ray): the pool waits with ``poll``,
    which ``select``'s limit of 1024 does not bind."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1400:
        pytest.skip(f"the hard limit on descriptors ({hard}) is too low to pass 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1400), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with attack_pool(num_workers=2) as pool:
            assert pool._state.zygote.fileno() > 1024
            outcomes = pool.map(calls_for(["1", "2", "sleep:0.1"]), timeout_s=30.0)
            assert [o.score for o in outcomes] == [1.0, 2.0, 0.1]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
