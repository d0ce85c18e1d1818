"""Scorer isolation: the scorer is imported at start-up under a bound, in a zygote the workers
are forked from (fast replacement, nothing of the trainer in them), every non-number is invalid,
async scorers run under the same timeout, and a batch that fails too much stops the run.

The scorers are named by file path and never imported by this process. No test asserts a wall
time: each asserts what happened (counts, processes, messages); ``timeout`` marks only keep a
broken implementation from hanging the suite.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from stages.reward.accounting import ScorerFailureError
from stages.reward.custom import DEFAULT_SCORER, scorer_ref
from stages.reward.loop import RewardLoop
from stages.reward.pool import ScorerPool
from stages.reward.settings import RewardSettings
from stages.reward.zygote import ScorerStartupError

ISOLATION = Path(__file__).with_name("isolation_scorers.py")


def ref(name: str):
    return scorer_ref(ISOLATION, name)


def calls_for(solutions: list[str], data_source: str = "test/source") -> list[dict]:
    return [
        {"data_source": data_source, "solution_str": s, "ground_truth": "", "extra_info": None}
        for s in solutions
    ]


def uids_for(n: int) -> list[str]:
    return [f"u{i}" for i in range(n)]


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def zygotes_of_this_process() -> list[int]:
    """Live (not zombie) children of this process that run the reward zygote."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        is_child = int(fields[1]) == os.getpid() and fields[0] != "Z"
        if is_child and b"stages.reward.zygote" in cmdline:
            found.append(int(entry.name))
    return found


def not_imported_here(path: Path) -> bool:
    return all(getattr(m, "__file__", None) != str(path) for m in list(sys.modules.values()))


# --- 1. the import runs at start-up, under a bound ---------------------------------------------


@pytest.mark.timeout(60)
def test_a_scorer_file_whose_import_hangs_fails_in_one_line_naming_it(tmp_path):
    hangs = tmp_path / "hangs_at_import.py"
    hangs.write_text(
        "import time\ntime.sleep(3600)\n\ndef compute_score(**kwargs):\n    return 1\n"
    )
    settings = RewardSettings(num_workers=2, startup_timeout_s=1.0, custom_path=str(hangs))
    with pytest.raises(ScorerStartupError) as info:
        RewardLoop(None, settings)
    message = str(info.value)
    assert "\n" not in message
    assert str(hangs) in message and "did not finish importing within 1 s" in message
    assert "reward.startup_timeout_s" in message
    assert zygotes_of_this_process() == []  # the hung process was killed, nothing left behind
    assert not_imported_here(hangs)


@pytest.mark.timeout(60)
def test_a_slow_import_is_waited_for_up_to_the_bound(tmp_path):
    slow = tmp_path / "slow_import.py"
    slow.write_text(
        "import time\ntime.sleep(0.5)\n\ndef compute_score(**kwargs):\n    return 2.0\n"
    )
    settings = RewardSettings(num_workers=1, startup_timeout_s=30.0, custom_path=str(slow))
    with RewardLoop(None, settings) as loop:
        assert loop.score_calls(calls_for(["x"]), ["u0"]).scores.tolist() == [2.0]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1 / 0\n", "could not be loaded: ZeroDivisionError: division by zero"),
        ("import os\nos._exit(7)\n", "its process exited with code 7 while importing it"),
        ("def other():\n    pass\n", "AttributeError: scorer 'compute_score' not found"),
    ],
)
def test_a_scorer_file_that_fails_to_load_is_one_line_with_its_own_error(
    tmp_path, source, expected
):
    broken = tmp_path / "broken.py"
    broken.write_text(source)
    with pytest.raises(ScorerStartupError) as info:
        ScorerPool(scorer_ref(broken), num_workers=1, startup_timeout_s=30.0)
    assert expected in str(info.value) and str(broken) in str(info.value)
    assert "\n" not in str(info.value)
    assert zygotes_of_this_process() == []


def test_the_start_up_bound_comes_from_the_config():
    from stages.config import load_config
    from stages.reward.settings import settings_from_config

    overrides = [
        "reward.startup_timeout_s=7.5",
        "reward.max_invalid_fraction=0.25",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    ]
    settings = settings_from_config(load_config(None, overrides))
    assert (settings.startup_timeout_s, settings.max_invalid_fraction) == (7.5, 0.25)
    assert RewardSettings().startup_timeout_s == 60.0 and RewardSettings().max_invalid_fraction == 1
    with pytest.raises(ValueError, match=r"reward.startup_timeout_s must be > 0"):
        RewardSettings(startup_timeout_s=0)
    with pytest.raises(ValueError, match=r"reward.max_invalid_fraction must be in \[0, 1\]"):
        RewardSettings(max_invalid_fraction=1.5)


# --- 2. a worker killed for a timeout is forked again, the scorer not re-imported --------------


@pytest.mark.timeout(120)
def test_timeouts_are_replaced_by_forks_of_the_zygote_without_a_new_import(tmp_path):
    log = tmp_path / "imports.log"
    counted = tmp_path / "counted.py"
    counted.write_text(
        "import os, time\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if solution_str == 'sleep':\n"
        "        time.sleep(3600)\n"
        "    return float(solution_str)\n"
    )
    settings = RewardSettings(num_workers=2, timeout_s=0.3, custom_path=str(counted))
    with RewardLoop(None, settings) as loop:
        pool = loop.pool
        zygote_pid = pool._state.zygote.process.pid
        assert log.read_text().split() == [str(zygote_pid)]  # imported at start-up, once
        solutions = ["sleep" if i % 4 == 1 else str(i) for i in range(32)]
        result = loop.score_calls(calls_for(solutions), uids_for(32))
        assert result.counts == {"error": 0, "timeout": 8, "invalid": 0}
        expected = [0.0 if i % 4 == 1 else float(i) for i in range(32)]
        assert result.scores.tolist() == expected
        assert (pool.restarts, pool.zygote_restarts) == (8, 0)
        assert log.read_text().split() == [str(zygote_pid)]  # no replacement imported again
        assert [parent_of(pid) for pid in pool.worker_pids] == [zygote_pid] * 2
    assert not_imported_here(counted)
    assert zygotes_of_this_process() == []


@pytest.mark.timeout(120)
def test_a_zygote_killed_from_outside_is_started_again_and_scoring_goes_on():
    with ScorerPool(ref("hangs_on_sleep"), num_workers=1, startup_timeout_s=30.0) as pool:
        old = pool._state.zygote.process
        os.kill(old.pid, signal.SIGKILL)
        old.wait()
        outcomes = pool.map(calls_for(["1", "sleep", "3"]), timeout_s=0.3)
        assert [o.status for o in outcomes] == ["ok", "timeout", "ok"]
        assert [o.score for o in outcomes if o.status == "ok"] == [1.0, 3.0]
        assert pool.zygote_restarts == 1
        assert parent_of(pool.worker_pids[0]) == pool._state.zygote.process.pid


# --- 3. workers hold what scoring needs, nothing of the trainer --------------------------------


def test_a_worker_holds_no_torch_deepspeed_prefect_or_mlflow_and_reruns_no_script():
    import torch  # noqa: F401  (this process holds the trainer's modules; the workers must not)

    with ScorerPool(ref("report_modules"), num_workers=1) as pool:
        (outcome,) = pool.map(calls_for(["x"]), timeout_s=30.0)
    assert outcome.status == "ok"
    assert outcome.extras["heavy"] == []
    assert outcome.extras["main_file"] is None  # `python -c`: no driver __main__ was run
    assert outcome.extras["mp_main_file"] is None  # nor a multiprocessing re-run of one


def test_the_built_in_router_worker_is_as_lean(tmp_path):
    calls = calls_for(["#### 7"], "openai/gsm8k") + calls_for(["c"], "ppoflow/demo-copy")
    calls[0]["ground_truth"], calls[1]["ground_truth"] = "7", "c"
    with ScorerPool(ref("report_builtin_modules"), num_workers=1) as pool:
        outcomes = pool.map(calls, timeout_s=30.0)
    assert [o.score for o in outcomes] == [1.0, 1.0]
    assert [o.extras["heavy"] for o in outcomes] == [[], []]
    with ScorerPool(DEFAULT_SCORER, num_workers=1) as pool:
        assert not pool.info.wants_prompt and not pool.info.is_async


# --- 4. anything but a finite number is invalid, with the uid logged ---------------------------

INVALID_CASES = {
    "str": "returned str '1.0'",
    "none": "returned NoneType None",
    "nan": "returned float nan",
    "inf": "returned float inf",
    "-inf": "returned float -inf",
    "list": "returned list [1.0]",
    "nodict": "dict result has no 'score' key",
    "nan_score": "dict 'score' is float nan",
    "str_score": "dict 'score' is str '1'",
    "set_extra": "extra 'seen' is a builtins.set, which the artifact cannot store",
    "bytes_extra": "extra 'raw' is a builtins.bytes, which the artifact cannot store",
    "object_extra": "could not be read back in the driver",
    "nested_set_extra": "extra 'info'['a'][0]['b'] is a builtins.set",
    "int_key_extra": "extra name 3 is not a non-empty str",
    "reserved_extra": "extra 'uid' has the name of a batch key of its own",
}


@pytest.fixture(scope="module")
def returns_loop():
    settings = RewardSettings(num_workers=2, timeout_s=10.0, error_score=-1.0)
    with RewardLoop(None, settings, scorer=ref("returns")) as loop:
        yield loop


def test_every_non_number_is_invalid_alone_and_logged_with_its_uid(returns_loop, caplog):
    solutions = ["2", *INVALID_CASES, "3"]
    uids = uids_for(len(solutions))
    with caplog.at_level(logging.WARNING, logger="stages.reward.loop"):
        result = returns_loop.score_calls(calls_for(solutions), uids)
    bad = len(INVALID_CASES)
    assert result.counts == {"error": 0, "timeout": 0, "invalid": bad}
    assert result.scores.tolist() == [2.0] + [-1.0] * bad + [3.0]
    messages = [r.getMessage() for r in caplog.records]
    for i, (case, expected) in enumerate(INVALID_CASES.items(), start=1):
        assert result.outcomes[i].status == "invalid", case
        assert expected in result.outcomes[i].message, case
        (line,) = [m for m in messages if f"uid=u{i} " in m]
        assert line.startswith("reward invalid for uid=") and expected in line
    assert set(result.extras) == {"acc"}  # no invalid sample's extras reach the batch


def test_storable_nested_extras_are_kept_and_the_artifact_saves_them(returns_loop, tmp_path):
    import numpy as np
    import torch

    from dataproto import DataProto
    from dataproto.artifact import ArtifactTypeError, load_artifact, save_artifact

    result = returns_loop.score_calls(calls_for(["nested_extra", "1"]), uids_for(2))
    assert result.counts == {"error": 0, "timeout": 0, "invalid": 0}
    assert result.extras["info"].tolist() == [{"a": [1, (2, "x")], "b": None}, None]
    delta = DataProto.from_dict({"seq_scores": torch.tensor(result.scores)}, result.extras)
    save_artifact(delta, tmp_path / "ok")
    assert load_artifact(tmp_path / "ok").non_tensor_batch["info"][0]["a"] == [1, (2, "x")]
    refused = np.array([{1, 2}, None], dtype=object)  # what set_extra would have stored
    with pytest.raises(ArtifactTypeError):
        save_artifact(DataProto.from_dict({}, {"seen": refused}), tmp_path / "refused")


def test_a_wrong_signature_is_an_error_naming_the_type_error():
    loop = RewardLoop(None, RewardSettings(num_workers=1), scorer=ref("wrong_signature"))
    with loop, pytest.raises(ScorerFailureError) as info:
        loop.score_calls(calls_for(["1", "2"]), uids_for(2))
    message = str(info.value)
    assert "failed on 2 of 2 samples (2 error)" in message
    assert "TypeError: wrong_signature() got an unexpected keyword argument" in message
    assert "worker.py" not in message  # the call failed before entering the scorer


# --- 5. async scorers run in the worker under the per-sample timeout --------------------------


@pytest.mark.timeout(120)
def test_an_async_scorer_that_blocks_its_loop_is_killed_at_the_timeout():
    settings = RewardSettings(num_workers=1, timeout_s=0.3, error_score=-1.0)
    with RewardLoop(None, settings, scorer=ref("async_blocks")) as loop:
        assert loop.is_async
        first = loop.pool.worker_pids
        result = loop.score_calls(calls_for(["1", "block", "await", "4"]), uids_for(4))
        assert [o.status for o in result.outcomes] == ["ok", "timeout", "timeout", "ok"]
        assert result.scores.tolist() == [1.0, -1.0, -1.0, 4.0]
        assert loop.pool.restarts == 2 and loop.pool.worker_pids != first


# --- 6. a batch that fails too much stops the run with the scorer's own error ----------------


def test_a_scorer_failing_on_every_sample_stops_with_its_first_error():
    loop = RewardLoop(None, RewardSettings(num_workers=2), scorer=ref("always_raises"))
    with loop, pytest.raises(ScorerFailureError) as info:
        loop.score_calls(calls_for(["a", "b", "c"]), uids_for(3))
    message = str(info.value)
    assert "\n" not in message
    assert f"reward scorer {ISOLATION}:always_raises failed on 3 of 3 samples (3 error)" in message
    assert "First failure, uid='u0': error: raised ValueError: cannot score 'a'" in message
    assert f"(at {ISOLATION}:" in message and "in always_raises)" in message
    assert "reward.max_invalid_fraction=1" in message


def test_a_scorer_returning_none_everywhere_stops_the_run(returns_loop):
    with pytest.raises(ScorerFailureError, match=r"3 of 3 samples \(3 invalid\).*uid='u0'"):
        returns_loop.score_calls(calls_for(["none"] * 3), uids_for(3))


@pytest.mark.parametrize(
    ("max_fraction", "stops"), [(1.0, False), (0.5, False), (0.49, True), (0.0, True)]
)
def test_the_failed_share_stops_the_run_only_past_the_configured_fraction(max_fraction, stops):
    settings = RewardSettings(num_workers=1, max_invalid_fraction=max_fraction)
    with RewardLoop(None, settings, scorer=ref("raises_on_odd")) as loop:
        calls = calls_for(["0", "1", "2", "3"])  # half of them raise
        if not stops:
            assert loop.score_calls(calls, uids_for(4)).counts["error"] == 2
            return
        with pytest.raises(ScorerFailureError) as info:
            loop.score_calls(calls, uids_for(4))
    assert "failed on 2 of 4 samples" in str(info.value)
    assert "uid='u1': error: raised ValueError: odd sample 1" in str(info.value)


def test_the_reward_stage_raises_the_scorer_failure_and_returns_nothing(batch_factory):
    from stages.reward.stage import LOOP_ENGINE, compute_reward

    settings = RewardSettings(num_workers=1)
    with RewardLoop(None, settings, scorer=ref("always_raises")) as loop:
        loop.tokenizer = _Chars()
        batch = batch_factory(["1", "2"])
        with pytest.raises(ScorerFailureError, match="uid='u0'"):
            compute_reward(batch, settings, {LOOP_ENGINE: loop})


class _Chars:
    """Decodes token ids as characters (enough for build_calls)."""

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(65 + t % 26) for t in row) for row in rows]


def test_samples_that_fail_alike_are_one_line(returns_loop, caplog):
    """A scorer failing the same way on many samples logs one line with the count, not one line
    per sample (the uids of the first three are named)."""
    solutions = ["none"] * 5 + ["2"]
    with caplog.at_level(logging.WARNING, logger="stages.reward.loop"):
        result = returns_loop.score_calls(calls_for(solutions), uids_for(len(solutions)))
    assert result.counts["invalid"] == 5
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reward ")]
    assert line.startswith("reward invalid for 5 samples (uid=u0, uid=u1, uid=u2 and 2 more;")
