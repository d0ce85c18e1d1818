"""Cross-field rules of the run config, all in one place.

Each rule returns messages that start with the dotted key(s) at fault, give the values received
and say how to fix them. ``cross_field_problems`` (errors) runs on the filled config inside
``PPORunConfig``'s validation; ``cross_field_warnings`` lists legal but suspicious settings.

What "token-mean across DP" means here: verl 0.9.1's ``agg_loss`` refuses ``token-mean`` (and the
``seq-mean-*`` modes) on more than one DP rank unless the global token / sequence counts are
passed. ppoflow's engines always pass them (Σ response_mask over the global mini-batch, and
``ppo_mini_batch_size × rollout.n``), so every ``loss_agg_mode`` is valid at any DP size and no
combination is rejected for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stages.algos.advantages import ADV_ESTIMATORS
from stages.algos.aggregation import AGG_LOSS_MODES
from stages.algos.defaults import ROLLOUT_CORRECTION_DEFAULTS
from stages.algos.kl_control import KL_CONTROLLERS
from stages.config.checks_dapo import dynamic_sampling_problems, overlong_problems
from stages.config.checks_lora import lora_problems, lora_warnings
from stages.config.checks_schedule import schedule_problems
from stages.config.derived import is_critic_used
from stages.engines.rollout_backends import ROLLOUT_BACKENDS

if TYPE_CHECKING:
    from stages.config.root import PPORunConfig

ARR = "actor_rollout_ref"
RC = "algorithm.rollout_correction"
DP = "trainer.n_gpus_per_node × trainer.nnodes"


def cross_field_problems(cfg: PPORunConfig) -> list[str]:
    """Every violated cross-field rule of a filled config (empty when the config is valid)."""
    return [
        *_batch_problems(cfg, "actor"),
        *(_batch_problems(cfg, "critic") if is_critic_used(cfg) else []),
        *_algorithm_problems(cfg),
        *_rollout_correction_problems(cfg),
        *_loss_problems(cfg),
        *_engine_problems(cfg),
        *_trainer_problems(cfg),
        *_reward_problems(cfg),
        *dynamic_sampling_problems(cfg),
        *overlong_problems(cfg),
        *lora_problems(cfg),
        *schedule_problems(cfg),
    ]


def _reward_problems(cfg: PPORunConfig) -> list[str]:
    if cfg.reward.score_in_rollout and cfg.reward.reward_model.enable:
        return [
            "reward.score_in_rollout = true scores each trajectory with the rule-based reward "
            "loop inside the rollout, but reward.reward_model.enable = true scores the batch "
            "after it; set reward.score_in_rollout = false (or null) or disable the reward model"
        ]
    return []


def _batch_problems(cfg: PPORunConfig, role: str) -> list[str]:
    """train_batch_size × n vs DP size and mini-batch; mini ≤ train batch; micro divides mini."""
    section = cfg.actor_rollout_ref.actor if role == "actor" else cfg.critic
    key = f"{ARR}.actor" if role == "actor" else "critic"
    n, train = cfg.actor_rollout_ref.rollout.n, cfg.data.train_batch_size
    mini = section.ppo_mini_batch_size
    dp = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    problems = []
    if role == "actor" and (train * n) % dp:
        problems.append(
            f"data.train_batch_size × {ARR}.rollout.n = {train} × {n} = {train * n} sequences is "
            f"not divisible by the DP size {DP} = {dp}; make the product a multiple of {dp}"
        )
    if mini > train:
        problems.append(
            f"{key}.ppo_mini_batch_size = {mini} is larger than data.train_batch_size = {train}; "
            f"it must be ≤ the training batch (both in prompts)"
        )
    elif train % mini:
        problems.append(
            f"data.train_batch_size = {train} is not divisible by {key}.ppo_mini_batch_size = "
            f"{mini}; each step's batch must split into whole mini-batches"
        )
    if (mini * n) % dp:
        problems.append(
            f"{key}.ppo_mini_batch_size × {ARR}.rollout.n = {mini} × {n} = {mini * n} sequences "
            f"is not divisible by the DP size {DP} = {dp}"
        )
    elif not section.use_dynamic_bsz and (mini * n // dp) % section.ppo_micro_batch_size_per_gpu:
        problems.append(
            f"{key}.ppo_micro_batch_size_per_gpu = {section.ppo_micro_batch_size_per_gpu} does not "
            f"divide the per-rank mini-batch {key}.ppo_mini_batch_size × n / DP = {mini} × {n} / "
            f"{dp} = {mini * n // dp} sequences"
        )
    return problems


def _algorithm_problems(cfg: PPORunConfig) -> list[str]:
    """Estimator needs (its registry entry: critic, sampling, group size) and the KL controller's
    (its registry entry: the fields it needs > 0)."""
    algo, rollout = cfg.algorithm, cfg.actor_rollout_ref.rollout
    estimator, name = ADV_ESTIMATORS.get(algo.adv_estimator), repr(algo.adv_estimator)
    problems = []
    if estimator.needs_values and cfg.critic.enable is False:
        problems.append(
            f"critic.enable = false but algorithm.adv_estimator = {name} needs a critic's values; "
            "enable the critic (or leave it null) or pick a critic-free estimator such as grpo"
        )
    if estimator.needs_greedy_baseline and not rollout.do_sample:
        problems.append(
            f"{ARR}.rollout.do_sample = false but algorithm.adv_estimator = {name} compares "
            "sampled responses with a greedy baseline; set do_sample = true"
        )
    if rollout.n < estimator.min_group_size:
        problems.append(
            f"{ARR}.rollout.n = {rollout.n} but algorithm.adv_estimator = {name} needs "
            f"groups of at least {estimator.min_group_size} samples; set n ≥ "
            f"{estimator.min_group_size}"
        )
    ctrl = algo.kl_ctrl
    for field in KL_CONTROLLERS.get(ctrl.type).positive:  # its registry entry's needs
        value = getattr(ctrl, field)
        if value <= 0:
            problems.append(
                f"algorithm.kl_ctrl.{field} = {value} but the {ctrl.type} controller needs > 0"
            )
    return problems


def _rollout_correction_problems(cfg: PPORunConfig) -> list[str]:
    """Settings that would do nothing (a bypass loss_type outside bypass mode, batch
    normalization without weights) and a policy loss that bypass mode's would replace.

    (Every rollout backend returns ``rollout_log_probs``, so IS and rejection always have them;
    the stages that read them require the key, and a step plan without it fails naming it.)"""
    rc, problems = cfg.algorithm.rollout_correction, []
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    default_loss = ROLLOUT_CORRECTION_DEFAULTS["loss_type"]
    if rc.loss_type != default_loss and not rc.bypass_mode:
        problems.append(
            f"{RC}.loss_type = {rc.loss_type!r} needs {RC}.bypass_mode = true (it is bypass "
            f"mode's loss, weighing the current policy against the rollout's log-probs; got "
            f"bypass_mode = {str(rc.bypass_mode).lower()}); set bypass_mode = true or loss_type = "
            f"{default_loss!r}"
        )
    if rc.rollout_is_batch_normalize and rc.rollout_is is None:
        problems.append(
            f"{RC}.rollout_is_batch_normalize = true has no effect with {RC}.rollout_is = null; "
            "set rollout_is (token or sequence) or remove it"
        )
    asks = [
        text
        for text, asked in (
            (f"rollout_is = {rc.rollout_is!r}", rc.rollout_is is not None),
            (f"rollout_rs = {','.join(rc.rollout_rs or ())!r}", rc.rollout_rs is not None),
            (f"loss_type = {rc.loss_type!r}", rc.loss_type != default_loss),
        )
        if asked
    ]
    if rc.bypass_mode and asks and loss_mode != "vanilla":
        problems.append(
            f"{ARR}.actor.policy_loss.loss_mode = {loss_mode!r} would be replaced: with "
            f"{RC}.bypass_mode = true and {', '.join(asks)} the policy loss is bypass mode's "
            f"{rc.loss_type!r} loss (verl replaces it silently); use loss_mode = 'vanilla', or "
            "bypass_mode = false to correct with the weights and mask in decoupled mode"
        )
    return problems


def _loss_problems(cfg: PPORunConfig) -> list[str]:
    """loss_scale_factor only with a mode that reads it (its registry entry says so: of the
    built-in ones, seq-mean-token-sum-norm); clip_cov window ordered."""
    problems = []
    scaled = " or ".join(
        repr(mode) for mode in AGG_LOSS_MODES if AGG_LOSS_MODES.get(mode).reads_loss_scale_factor
    )
    for key, section in ((f"{ARR}.actor", cfg.actor_rollout_ref.actor), ("critic", cfg.critic)):
        if (
            section.loss_scale_factor is not None
            and not AGG_LOSS_MODES.get(section.loss_agg_mode).reads_loss_scale_factor
        ):
            problems.append(
                f"{key}.loss_scale_factor = {section.loss_scale_factor} has no effect with "
                f"{key}.loss_agg_mode = {section.loss_agg_mode!r}; it only applies to "
                f"{scaled} (set it to null or change the mode)"
            )
    pl = cfg.actor_rollout_ref.actor.policy_loss
    if pl.clip_cov_lb >= pl.clip_cov_ub:
        problems.append(
            f"{ARR}.actor.policy_loss.clip_cov_lb = {pl.clip_cov_lb} must be < clip_cov_ub = "
            f"{pl.clip_cov_ub}"
        )
    return problems


def _engine_problems(cfg: PPORunConfig) -> list[str]:
    """ZeRO offload needs, rollout parallelism, reward model path, dynamic-batch token budgets."""
    arr, problems = cfg.actor_rollout_ref, []
    offloads = (  # (key, zero_stage, param_offload, optimizer_offload)
        (f"{ARR}.actor", arr.actor.zero_stage, arr.actor.param_offload, arr.actor.optimizer_offload),
        (f"{ARR}.ref", arr.ref.zero_stage, arr.ref.param_offload, False),  # no optimizer
        ("critic", cfg.critic.zero_stage, cfg.critic.param_offload, cfg.critic.optimizer_offload),
    )  # fmt: skip
    for key, zero_stage, param_offload, optimizer_offload in offloads:
        if param_offload and zero_stage != 3:
            problems.append(
                f"{key}.param_offload = true needs {key}.zero_stage = 3 (got {zero_stage})"
            )
        if optimizer_offload and zero_stage == 0:
            problems.append(f"{key}.optimizer_offload = true needs {key}.zero_stage ≥ 1 (got 0)")
    tp, devices = (
        arr.rollout.tensor_model_parallel_size,
        cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes,
    )
    rollout_backend = ROLLOUT_BACKENDS.get(arr.rollout.name)
    most_tp = rollout_backend.max_tensor_parallel_size
    if most_tp is not None and tp > most_tp:
        problems.append(
            f"{ARR}.rollout.tensor_model_parallel_size = {tp} but rollout.name = "
            f"{arr.rollout.name!r} runs with at most {most_tp} "
            f"({rollout_backend.why_max_tensor_parallel}); set it to {most_tp}"
            + (" or less" if most_tp > 1 else "")
        )
    elif devices % tp:
        problems.append(
            f"{ARR}.rollout.tensor_model_parallel_size = {tp} does not divide the {devices} "
            f"devices ({DP})"
        )
    rm = cfg.reward.reward_model
    if rm.enable and rm.model_path is None:
        problems.append("reward.reward_model.enable = true needs reward.reward_model.model_path")
    return problems + _token_budget_problems(cfg)


def _token_budget_problems(cfg: PPORunConfig) -> list[str]:
    """With dynamic batching, one full-length sequence must fit in a micro-batch's token budget."""
    arr, problems = cfg.actor_rollout_ref, []
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    budgets = (
        (f"{ARR}.actor.ppo_max_token_len_per_gpu", arr.actor.use_dynamic_bsz, arr.actor.ppo_max_token_len_per_gpu),
        ("critic.ppo_max_token_len_per_gpu", cfg.critic.use_dynamic_bsz, cfg.critic.ppo_max_token_len_per_gpu),
        (f"{ARR}.rollout.log_prob_max_token_len_per_gpu", arr.rollout.log_prob_use_dynamic_bsz, arr.rollout.log_prob_max_token_len_per_gpu),
        (f"{ARR}.ref.log_prob_max_token_len_per_gpu", arr.ref.log_prob_use_dynamic_bsz, arr.ref.log_prob_max_token_len_per_gpu),
    )  # fmt: skip
    for key, dynamic, budget in budgets:
        if dynamic and budget < longest:
            problems.append(
                f"{key} = {budget} tokens is less than one full sequence, data.max_prompt_length + "
                f"data.max_response_length = {longest}; raise it to ≥ {longest}"
            )
    return problems


def _trainer_problems(cfg: PPORunConfig) -> list[str]:
    """Resume settings agree with each other."""
    tr, problems = cfg.trainer, []
    if tr.resume_mode == "resume_path":
        if tr.resume_from_path is None:
            problems.append(
                "trainer.resume_mode = 'resume_path' needs trainer.resume_from_path (…/global_step_N)"
            )
        elif "global_step_" not in tr.resume_from_path:
            problems.append(
                f"trainer.resume_from_path = {tr.resume_from_path!r} must name a checkpoint "
                "folder …/global_step_N (the step is read from it)"
            )
    elif tr.resume_from_path is not None:
        problems.append(
            f"trainer.resume_from_path = {tr.resume_from_path!r} is ignored unless "
            f"trainer.resume_mode = 'resume_path' (got {tr.resume_mode!r})"
        )
    return problems


def cross_field_warnings(cfg: PPORunConfig) -> list[str]:
    """Legal settings that are probably a mistake (verl accepts them silently)."""
    algo, n = cfg.algorithm, cfg.actor_rollout_ref.rollout.n
    estimator = ADV_ESTIMATORS.get(algo.adv_estimator)
    warnings = []
    if estimator.group_based and n == 1 and estimator.min_group_size <= 1:  # else an error
        warnings.append(
            f"algorithm.adv_estimator = {algo.adv_estimator!r} with {ARR}.rollout.n = 1: every "
            "group is a singleton, so the group baseline is not used; set n > 1"
        )
    rc = algo.rollout_correction
    if rc.bypass_mode and rc.loss_type == "ppo_clip" and rc.rollout_is is not None:
        warnings.append(
            f"{RC}.rollout_is = {rc.rollout_is!r} with bypass_mode = true and loss_type = "
            "'ppo_clip': the weights are computed for the rollout_corr/* metrics only (the PPO "
            "ratio already is π_θ/π_rollout, as in verl); set bypass_mode = false to multiply them "
            "into the loss, or loss_type = 'reinforce'"
        )
    fg = algo.filter_groups
    if fg.max_num_gen_batches and not fg.enable:
        warnings.append(
            f"algorithm.filter_groups.max_num_gen_batches = {fg.max_num_gen_batches} has no "
            "effect while algorithm.filter_groups.enable = false (one generation round per step)"
        )
    if cfg.critic.enable and not estimator.needs_values:
        warnings.append(
            f"critic.enable = true with algorithm.adv_estimator = {algo.adv_estimator!r}: the "
            "critic is trained but its values do not enter the advantages"
        )
    return warnings + lora_warnings(cfg)
