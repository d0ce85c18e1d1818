"""End to end: a 2-step ReMax run of the train flow on the tiny model and the demo prompts.

Checked against independent computations from the run's artifacts:
- ``baseline_responses`` of step 1 are Hugging Face greedy decoding of each prompt by the
  initial model (one per prompt, the same on every row of the prompt);
- ``reward_baselines`` are the scorer's scores of those greedy responses (a custom scorer that
  gives every response its own non-zero score, so the check is not 0 == 0);
- advantages = (reward-to-go − reward_baselines) × response_mask, not whitened.

The baseline stages run before (baseline_rollout) and after (baseline_reward) the balance stage,
so rows are matched through the balance permutation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from dataproto.artifact import load_artifact
from flows.rerun import rerun
from flows.runs.store import RunStore
from flows.train import train
from stages.data.tokenizer import load_tokenizer
from stages.metrics.catalog import step_metric_names

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
RESPONSE_LENGTH = 8  # tiny_run_overrides' data.max_response_length
#: the demo config's step_metric_names flags (GRPO: no critic, no reference, balanced)
FLAGS = dict(
    use_critic=False,
    use_reference_policy=False,
    balance_batch=True,
    use_kl_in_reward=False,
    use_kl_loss=False,
)
SCORER = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Every response its own non-zero score: 0.5 + length + a hash of its characters."""
    return 0.5 + 0.1 * len(solution_str) + (sum(map(ord, solution_str)) % 89) / 89.0
'''


def scorer_score(text: str) -> float:
    return 0.5 + 0.1 * len(text) + (sum(map(ord, text)) % 89) / 89.0


def remax_overrides(
    tiny_run_overrides, demo: Path, out: Path, steps: int, *extra: str
) -> list[str]:
    """The tiny run's overrides for ReMax, scored by :data:`SCORER` (written to out/scorer.py)."""
    scorer = out / "scorer.py"
    scorer.write_text(SCORER, encoding="utf-8")
    return tiny_run_overrides(
        demo,
        out,
        steps,
        "algorithm.adv_estimator=remax",
        f"reward.custom_reward_function.path={scorer}",
        "trainer.val_before_train=false",
        *extra,
    )


@pytest.fixture(scope="module")
def remax_run(tmp_path_factory, make_demo_inputs, tiny_run_overrides):
    demo = make_demo_inputs(tmp_path_factory.mktemp("demo"))
    out = tmp_path_factory.mktemp("remax")
    overrides = remax_overrides(tiny_run_overrides, demo, out, 2)
    result = train(REPO / "configs" / "demo-cpu.yaml", overrides, str(out / "run"))
    return demo, result


def step_artifacts(run_dir: str, step: int) -> dict:
    store = RunStore(run_dir)
    journal = store.read_journal(step)
    assert journal.status == "done"
    for stage in ("baseline_rollout", "baseline_reward"):
        assert journal.record(stage).status == "ran", stage
    names = ("rollout", "baseline_rollout", "balance", "baseline_reward", "advantage")
    loaded = {name: load_artifact(store.artifact_path(step, name)) for name in names}
    loaded["input"] = load_artifact(journal.input_artifact)
    return loaded


def check_baselines_and_advantages(demo: Path, result, steps: int) -> None:
    """Every step: one greedy response per prompt on all its rows, reward_baselines = the
    scorer's score of it (balanced order), the metric, and A = (returns − baseline) × mask."""
    tokenizer = load_tokenizer(str(demo / "model"))
    for step in range(1, steps + 1):
        art = step_artifacts(result.run_dir, step)
        step_input, greedy = art["input"], art["baseline_rollout"].batch
        uids = step_input.non_tensor_batch["uid"]
        responses, mask = greedy["baseline_responses"], greedy["baseline_response_mask"]
        assert responses.shape == (len(uids), RESPONSE_LENGTH)
        for uid in set(uids):  # one greedy response per prompt, on all of its rows
            rows = torch.from_numpy(np.flatnonzero(uids == uid))
            assert torch.equal(responses[rows], responses[rows[:1]].expand(len(rows), -1))
        texts = [
            tokenizer.decode(row[m.bool()].tolist(), skip_special_tokens=True)
            for row, m in zip(responses, mask)
        ]  # input (pre-balance) order
        perm = art["balance"].batch["balance_order"]  # new row i = old row perm[i]
        expected = torch.tensor([scorer_score(texts[int(old)]) for old in perm])
        baselines = art["baseline_reward"].batch["reward_baselines"]  # balanced order
        assert baselines.dtype == torch.float32
        torch.testing.assert_close(baselines, expected)
        assert (expected != 0).all(), "the check would be vacuous"
        group_means = [scorer_score(texts[int(np.flatnonzero(uids == u)[0])]) for u in set(uids)]
        assert result.history[step - 1]["reward/baseline_mean"] == pytest.approx(
            float(np.mean(group_means)), rel=1e-5
        )

        adv = art["advantage"].batch
        response_mask = art["rollout"].batch["response_mask"][perm].float()
        rewards = adv["token_level_rewards"] * response_mask
        returns = rewards.flip(-1).cumsum(-1).flip(-1) * response_mask
        torch.testing.assert_close(adv["returns"], returns)
        torch.testing.assert_close(
            adv["advantages"], (returns - baselines[:, None]) * response_mask
        )
        assert (adv["advantages"] != 0).any()


def check_step_one_is_hf_greedy(demo: Path, run_dir: str) -> None:
    """Step 1's baselines are HF greedy decoding of each prompt by the initial model."""
    art = step_artifacts(run_dir, 1)
    step_input = art["input"]
    uids = step_input.non_tensor_batch["uid"]
    _, first = np.unique(uids, return_index=True)
    rows = torch.from_numpy(np.sort(first))
    tokenizer = load_tokenizer(str(demo / "model"))
    model = AutoModelForCausalLM.from_pretrained(demo / "model", dtype=torch.float32).eval()
    with torch.no_grad():
        sequences = model.generate(
            input_ids=step_input.batch["prompt_input_ids"][rows],
            attention_mask=step_input.batch["prompt_attention_mask"][rows],
            do_sample=False,
            max_new_tokens=RESPONSE_LENGTH,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    generated = sequences[:, step_input.batch["prompt_input_ids"].shape[1] :]
    expected = torch.nn.functional.pad(
        generated, (0, RESPONSE_LENGTH - generated.shape[1]), value=tokenizer.pad_token_id
    )
    torch.testing.assert_close(art["baseline_rollout"].batch["baseline_responses"][rows], expected)
    sampled = art["rollout"].batch["responses"][rows]
    assert not torch.equal(sampled, expected), "the sampled rollout is not the greedy one"


def test_remax_two_steps_baselines_are_greedy_scores(remax_run):
    demo, result = remax_run
    assert result.steps == 2
    check_baselines_and_advantages(demo, result, 2)
    remax_only = set(step_metric_names(**FLAGS, remax=True)) - set(step_metric_names(**FLAGS))
    assert remax_only == {
        "timing_s/baseline_rollout",
        "timing_s/baseline_reward",
        "reward/baseline_mean",
    }
    for row in result.history:  # every step logs them
        assert remax_only <= row.keys()


def test_step_one_baseline_is_hf_greedy_decoding_of_the_initial_model(remax_run):
    demo, result = remax_run
    check_step_one_is_hf_greedy(demo, result.run_dir)


OTHER_SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 2.0 + len(solution_str)
"""


def test_rerun_from_reward_with_another_scorer_recomputes_the_baselines(remax_run, tmp_path):
    """``ppoflow rerun --from reward`` with a changed reward function: the greedy responses are
    reused (no generation), the baselines are the new scorer's scores of them."""
    demo, result = remax_run
    scorer = tmp_path / "other_scorer.py"
    scorer.write_text(OTHER_SCORER, encoding="utf-8")
    branch = rerun(
        result.run_dir,
        1,
        "reward",
        to_stage="advantage",
        overrides=[f"reward.custom_reward_function.path={scorer}"],
        new_run_dir=str(tmp_path / "branch"),
    )
    parent = RunStore(result.run_dir).read_journal(1)
    journal = RunStore(branch.run_dir).read_journal(1)
    for stage in ("rollout", "baseline_rollout", "balance"):
        assert journal.record(stage).status == "cached", stage
        assert journal.record(stage).fingerprint == parent.record(stage).fingerprint
    for stage in ("reward", "baseline_reward", "advantage"):
        assert journal.record(stage).status == "ran", stage
    greedy = step_artifacts(result.run_dir, 1)["baseline_rollout"].batch
    tokenizer = load_tokenizer(str(demo / "model"))
    texts = [
        tokenizer.decode(row[m.bool()].tolist(), skip_special_tokens=True)
        for row, m in zip(greedy["baseline_responses"], greedy["baseline_response_mask"])
    ]
    perm = load_artifact(journal.record("balance").artifact).batch["balance_order"]
    expected = torch.tensor([2.0 + len(texts[int(old)]) for old in perm])
    baselines = load_artifact(journal.record("baseline_reward").artifact).batch
    torch.testing.assert_close(baselines["reward_baselines"], expected)
    assert branch.metrics["reward/baseline_mean"] != result.history[0]["reward/baseline_mean"]


def test_remax_on_two_ray_ranks(tmp_path, make_demo_inputs, tiny_run_overrides):
    """The greedy request reaches the ranks of a Ray actor group (4 prompts over 2 ranks)."""
    ray = pytest.importorskip(
        "ray", reason="the ray extra is not installed: pip install 'ppoflow[ray]'"
    )
    demo = make_demo_inputs(tmp_path / "demo", n_train=16, n_val=4)
    overrides = remax_overrides(
        tiny_run_overrides,
        demo,
        tmp_path,
        1,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "ppoflow.workers.backend=ray",
        "trainer.n_gpus_per_node=2",
    )
    result = train(REPO / "configs" / "demo-cpu.yaml", overrides, str(tmp_path / "run"))
    assert not ray.is_initialized()
    assert result.steps == 1
    check_baselines_and_advantages(demo, result, 1)
    check_step_one_is_hf_greedy(demo, result.run_dir)
