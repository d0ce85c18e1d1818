"""What every ppoflow metric measures, and over what it is averaged.

One :class:`MetricDoc` per metric or metric family, in a :class:`Registry` keyed by the name
pattern. ``{placeholder}`` parts of a pattern match the regex in :data:`PLACEHOLDERS`, so
``timing_s/{stage}`` covers ``timing_s/gen`` and ``timing_s/agent_loop/generate_sequences``.
:func:`describe_metric` looks a concrete name up (sanitized MLflow names work too) and
:func:`markdown_table` renders the catalog for ``docs/metrics.md``. :func:`step_metric_names`
lists the names a PPO step logs every step for a given config (:data:`STEP_METRICS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stages.metrics.naming import restore_metric_name
from stages.registry import Registry

#: regex of each placeholder that may appear in a pattern
PLACEHOLDERS = {
    "stat": "mean|max|min",
    "length_stat": "mean|max|min|clip_ratio",
    "stage": ".+",
    "token_stage": "gen|ref|values|adv|update_critic|update_actor",
    "role": "actor|critic|actor_infer",
    "model_role": "actor|critic",
    "memory_kind": "allocated|reserved",
    "seqlen_stat": "min|max|minmax_diff|balanced_min|balanced_max|mean",
    "section": "val-core|val-aux",
    "data_source": ".+",
    "var": "[^/]+",
    "n": "[0-9]+",
    "k": "[0-9]+",
    "mean_or_std": "mean|std",
    # rollout correction (the rs_option words are stages.algos.rollout_correction.ROLLOUT_RS_OPTIONS)
    "rs_option": "token_k1|token_k2|token_k3|seq_sum_k1|seq_sum_k2|seq_sum_k3|seq_mean_k1|"
    "seq_mean_k2|seq_mean_k3|seq_max_k2|seq_max_k3",
    "is_extreme": "max|min",
    "side": "high|low",
    "is_seq_stat": "mean|std|max|min|max_deviation",
    "rs_token_stat": "mean|std",
    "rs_extreme": "max|min|fraction_high|fraction_low",
    "rs_seq_stat": "mean|std|max|min|max_deviation|fraction_high|fraction_low",
    "policy": "training|rollout",
    # agent loop (stop reasons: stages.agent.loop.STOP_REASONS)
    "stop_reason": "length|max_assistant_turns|max_user_turns|no_tool_call|single_turn|"
    "tool_response_too_long|interaction_done|interaction_error|user_turn_too_long",
    "tool": "[^/]+",
    "system_metric": ".+",
    "check": "[a-z0-9_]+",  # a name in stages.health.checks.HEALTH_CHECKS
}
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True)
class MetricDoc:
    """One catalog entry: the name pattern, what it measures, its denominator, who emits it."""

    pattern: str
    what: str
    denominator: str
    emitted_by: str

    def description(self) -> str:
        return f"{self.what} Denominator: {self.denominator}."

    def regex(self) -> re.Pattern[str]:
        parts, last = [], 0
        for match in _PLACEHOLDER.finditer(self.pattern):
            parts += [
                re.escape(self.pattern[last : match.start()]),
                f"(?:{PLACEHOLDERS[match[1]]})",
            ]
            last = match.end()
        return re.compile("".join([*parts, re.escape(self.pattern[last:])]))


METRICS = Registry[MetricDoc]("metric description")

_DATA = "compute_data_metrics"
_ROWS = "real (non-padding) rows of the batch"
_NON_ABORTED = "non-aborted (response length > 0), non-padding rows; NaN if there are none"
_TOKENS = "response tokens (response_mask = 1) of non-padding rows; NaN if there are none"
_VAL = "process_validation_metrics + split_val_core_aux"
_PER_UID = "then averaged over the prompts (uids) of the data source that have this metric"
_AGENT = "rollout stage (agent loop)"
_RC = "rollout_correction / rollout_is / rollout_rs stages (decoupled); update_actor (bypass)"
_RC_WHERE = (
    " (decoupled mode: the step batch, π_train = old_log_probs; bypass mode: each actor "
    "micro-batch, π_train = the current policy, then averaged over micro-batches and mini-batches)"
)
_RC_TOKENS = "response tokens (the original response_mask)" + _RC_WHERE
_RC_ROWS = "non-empty responses (rows with a response token)" + _RC_WHERE
_RC_TOKENS_OR_ROWS = (
    "response tokens (token mode) or non-empty responses (sequence mode)" + _RC_WHERE
)
_RS_TOKENS_OR_ROWS = (
    "response tokens (token_* options) or non-empty responses (seq_* options)" + _RC_WHERE
)

_SIGNAL = "train flow, from the training batch (stages/metrics/signal.py)"
_ROUNDS = "train flow's generation rounds (flows/gen_rounds.py)"
_AHEAD = "train flow's rollouts launched ahead (flows/rollout_ahead.py)"
_PARTIAL = "train flow, from the rollout's rollout_policy_versions (stages/schedules.py), with ppoflow.schedule=fully_async and async_training.partial_rollout"
_ENTRIES = [
    # --- compute_data_metrics ---
    (
        "critic/score/{stat}",
        "Sequence score Σ_t token_level_scores (reward before any KL penalty) per row: mean, max or min.",
        _NON_ABORTED,
        _DATA,
    ),
    (
        "critic/rewards/{stat}",
        "Sequence reward Σ_t token_level_rewards (score minus the KL-in-reward term) per row.",
        _NON_ABORTED,
        _DATA,
    ),
    ("critic/advantages/{stat}", "Token advantages.", _TOKENS, _DATA),
    ("critic/returns/{stat}", "Token returns (value targets).", _TOKENS, _DATA),
    (
        "critic/values/{stat}",
        "Critic value predictions of the batch (only with a critic).",
        _TOKENS,
        _DATA,
    ),
    (
        "critic/vf_explained_var",
        "1 − var(returns − values) / (var(returns) + 1e-5) with unbiased (n − 1) variances; 1 = perfect critic, ≤ 0 = no better than a constant (only with a critic).",
        _TOKENS + " (NaN below 2 tokens)",
        _DATA,
    ),
    (
        "response_length/{length_stat}",
        "Response length in model tokens (response_mask sum: a multi-turn trajectory's tool tokens are not counted; verl counts them); clip_ratio = fraction of rows whose whole response (model and tool tokens, the response part of attention_mask) fills the padded width responses.shape[-1].",
        "all " + _ROWS + ", zero-length (aborted) rows included",
        _DATA,
    ),
    (
        "response_length_non_aborted/{length_stat}",
        "Response length and clip ratio as response_length/*, without aborted rows.",
        _NON_ABORTED,
        _DATA,
    ),
    (
        "response/aborted_ratio",
        "Fraction of rows whose response length is 0 (aborted or empty generations).",
        "all " + _ROWS,
        _DATA,
    ),
    (
        "prompt_length/{length_stat}",
        "Prompt length from the prompt part of attention_mask; clip_ratio = fraction of rows whose length equals prompts.shape[-1].",
        "all " + _ROWS,
        _DATA,
    ),
    (
        "num_turns/{stat}",
        "Conversation turns per sample (__num_turns__), when the rollout is multi-turn.",
        "all " + _ROWS,
        _DATA,
    ),
    (
        "tool_call_counts/{stat}",
        "Tool calls per sample (tool_call_counts), when the rollout reports them.",
        "all " + _ROWS,
        _DATA,
    ),
    # --- timing and throughput ---
    (
        "timing_s/rollout_wait",
        "Rollouts launched ahead (ppoflow.schedule one_step_off / fully_async): seconds the step waited for its batch's rollout, launched in an earlier step (in a run's first step: the whole rollout); 0 when it finished while earlier steps trained.",
        "none (a duration)",
        _AHEAD,
    ),
    (
        "timing_s/param_sync",
        "Rollouts launched ahead: seconds spent on the step's sync of the rollout replica with the actor's weights: the copy into the replica when it is idle, else the copy of the weights queued behind the running rollouts (0 when no sync is due or it holds them already). verl's name.",
        "none (a duration)",
        _AHEAD,
    ),
    (
        "fully_async/count/dropped_stale_samples",
        "Rollouts launched ahead: rows a resume dropped as stale, the rollouts its checkpoint had launched under another pace than the resumed run's (another ppoflow.schedule, staleness_threshold or trigger_parameter_sync_step); their prompts are generated again at their steps. Logged at every step of a schedule with rollouts apart (0 but at the resumed run's first step) and, on policy, at the resumed run's first step when it dropped any. verl's name (where it counts its queue's overflow, which a launch that waits for its turn does not have).",
        "none (a count of rows)",
        _AHEAD,
    ),
    (
        "fully_async/partial/total_partial_num",
        "Partial rollouts: samples whose response tokens were chosen by more than one policy version (a weight sync interrupted their generation and it went on under the new weights; rollout_policy_versions over response_mask). verl's name.",
        "none (a count of the step batch's rows)",
        _PARTIAL,
    ),
    (
        "fully_async/partial/partial_ratio",
        "Partial rollouts: the share of the step batch's samples that are partial (total_partial_num / rows). verl's name.",
        "rows of the step batch",
        _PARTIAL,
    ),
    (
        "fully_async/partial/max_partial_span",
        "Partial rollouts: the largest span of policy versions within one sample, max − min of its tokens' versions (0: no sample was interrupted). verl's name.",
        "none (a maximum over the step batch's rows)",
        _PARTIAL,
    ),
    (
        "lineage/staleness/{stat}",
        "Updates between the weights that generated a sample and the weights that train on it: step − 1 − policy_version of each row (0 on policy; 1 one step off, 0 in step 1; at most D + T − 1 fully async).",
        "rows of the step batch",
        "train flow, from the step input's policy_version column (stages/schedules.py)",
    ),
    (
        "rollout/weight_sync/probed",
        "The probe of the rollout engine's last weight sync (vLLM's, or a schedule's rollout replica), reported with every rollout after it: the tensors it compared, summed over the engine's workers (the normalisation weights, stages/engines/weight_probe.py). Absent before the first sync.",
        "none (a count of tensors)",
        "the vllm rollout backend and the rollout replicas, after a weight sync",
    ),
    (
        "rollout/weight_sync/mismatched",
        "Of rollout/weight_sync/probed, the tensors whose engine copy differs bit for bit from the tensor sent cast to the engine's dtype: > 0 is a sync that did not take (the weight_sync health check). NaN when nothing could be probed.",
        "none (a count of tensors)",
        "the vllm rollout backend and the rollout replicas, after a weight sync",
    ),
    (
        "health/{check}",
        "1.0 when the health check tripped at the step, 0.0 when it ran and did not; absent when it did not run (action off, a metric it reads not logged or NaN, first_step_agreement after step 1). The checks and their thresholds: docs/health.md.",
        "none (one step's verdict)",
        "train flow, after each step (stages/health)",
    ),
    (
        "timing_s/{stage}",
        "Wall-clock seconds spent in the stage this step; repeated timers of one name accumulate. timing_s/step spans generation through the update.",
        "none (a duration)",
        "compute_timing_metrics",
    ),
    (
        "timing_per_token_ms/{token_stage}",
        "Milliseconds per token of the stage: 1000 · timing_s/<stage> / tokens; 0 when there are no tokens.",
        "response tokens of every row for gen; prompt + response tokens (attention-mask counts) of every row for ref, values, adv, update_critic, update_actor",
        "compute_timing_metrics",
    ),
    (
        "perf/total_num_tokens",
        "Prompt + response tokens processed this step: Σ meta_info['global_token_num'].",
        "none (a sum over rows)",
        "compute_throughput_metrics",
    ),
    (
        "perf/time_per_step",
        "Seconds of the whole step (timing_s/step).",
        "none (a duration)",
        "compute_throughput_metrics",
    ),
    (
        "perf/throughput",
        "Tokens per second per device: perf/total_num_tokens / (perf/time_per_step · n_gpus).",
        "step seconds × number of devices",
        "compute_throughput_metrics",
    ),
    (
        "perf/mfu/{role}",
        "Model FLOPs utilization of the actor update, critic update or actor log-prob inference: achieved FLOP/s ÷ the device's peak. FLOPs are verl's dense-decoder estimate over each row's real tokens (6·N per token + 12·L·heads·head_dim·s² per sequence for forward + backward, a third for inference), times ppo_epochs for an update; logged only on a device with a known dense bf16 peak (CUDA devices of stages/metrics/flops.py's table), never on the CPU. Each rank's value, averaged over ranks.",
        "the pass's wall seconds (device synchronized) × the device's dense bf16 peak FLOP/s",
        "actor/critic workers (stages/engines/efficiency.py)",
    ),
    (
        "{model_role}/perf/max_memory_{memory_kind}_gb",
        "The most device memory torch's allocator has allocated (or reserved) since the worker's process started, in GiB, read after the role's update (and, for the actor, its log-prob pass); the largest over ranks. Logged only where perf/mfu is (a CUDA device of the table).",
        "none (a maximum, in GiB)",
        "actor/critic workers (stages/engines/efficiency.py)",
    ),
    # --- actor ---
    (
        "actor/pg_loss",
        "Policy-gradient loss of the actor update under loss_agg_mode.",
        "the loss_agg_mode denominators of the mini-batch (global token or sequence counts, all-reduced over DP), so micro-batch and DP splits do not change it; then averaged over mini-batches and PPO epochs",
        "update_actor",
    ),
    (
        "actor/pg_clipfrac",
        "Fraction of response tokens whose ratio was clipped on the upper side (the clipped term was the larger loss).",
        "response tokens of each micro-batch, averaged over micro-batches",
        "update_actor",
    ),
    (
        "actor/pg_clipfrac_lower",
        "Fraction of response tokens hit by the dual-clip lower bound (advantage < 0, ratio > clip_ratio_c).",
        "response tokens of each micro-batch, averaged over micro-batches",
        "update_actor",
    ),
    (
        "actor/ppo_kl",
        "Mean approximate KL(old ‖ current) = mean(old_log_prob − log_prob) of the update.",
        "response tokens of each micro-batch, averaged over micro-batches",
        "update_actor",
    ),
    (
        "actor/entropy",
        "Mean token entropy of the policy. Measured in the old_log_prob pass (the old policy) "
        "when it runs; with algorithm.rollout_correction.bypass_mode (the hf rollout's default) "
        "that pass does not run and the update's own forward measures it (detached from the "
        "loss when entropy_coeff is 0): the first mini-batch at the old policy, later ones after "
        "the step's earlier optimizer steps.",
        "old_log_prob: the actor's loss_agg_mode over the whole batch's response tokens (dp = 1); "
        "update: the loss_agg_mode over each mini-batch's response tokens, averaged over "
        "mini-batches",
        "old_log_prob, else update_actor",
    ),
    (
        "actor/entropy_loss",
        "Entropy term of the actor loss (before entropy_coeff).",
        "loss_agg_mode denominators, as actor/pg_loss",
        "update_actor",
    ),
    (
        "actor/kl_loss",
        "KL(current ‖ ref) penalty in the actor loss (use_kl_loss), by kl_loss_type.",
        "loss_agg_mode denominators, as actor/pg_loss",
        "update_actor",
    ),
    (
        "actor/kl_coef",
        "kl_loss_coef multiplying actor/kl_loss.",
        "none (a coefficient)",
        "update_actor",
    ),
    (
        "actor/grad_norm",
        "Global L2 norm of the actor gradients before clipping.",
        "none (a norm over all parameters)",
        "update_actor",
    ),
    (
        "actor/lr",
        "Actor learning rate after the scheduler step.",
        "none (a setting)",
        "update_actor",
    ),
    (
        "actor/reward_kl_penalty",
        "KL(old ‖ ref) subtracted from the reward (use_kl_in_reward): per-row mean over response tokens, then mean over rows.",
        "response tokens per row, then rows",
        "advantage (apply_kl_penalty)",
    ),
    (
        "actor/reward_kl_penalty_coeff",
        "β, the KL-in-reward coefficient used this step (fixed or adaptive controller).",
        "none (a coefficient)",
        "advantage (apply_kl_penalty)",
    ),
    # --- rollout correction: importance weights (rollout_is) ---
    (
        "rollout_corr/rollout_is_mean",
        "Mean IS weight w = π_train/π_rollout as applied (after the TIS clamp or IcePop's zeroing, before batch normalization).",
        _RC_TOKENS,
        _RC,
    ),
    (
        "rollout_corr/rollout_is_{is_extreme}",
        "Largest / smallest IS weight: the applied weights (token mode) or each response's raw weight exp(Σ log r), the max capped at e^20 (sequence mode).",
        _RC_TOKENS_OR_ROWS,
        _RC,
    ),
    (
        "rollout_corr/rollout_is_ratio_fraction_{side}",
        "Share of raw weights above the upper threshold u (high) or below the lower one (low; 1/u for TIS).",
        _RC_TOKENS_OR_ROWS,
        _RC,
    ),
    (
        "rollout_corr/rollout_is_std",
        "sqrt(E[w²] − E[w]²) of the applied weights clamped to [0, u]; 0 with fewer than 2 tokens.",
        _RC_TOKENS,
        _RC,
    ),
    (
        "rollout_corr/rollout_is_eff_sample_size",
        "Effective sample size 1 / E[(w / E[w])²] of the applied weights clamped to [0, u]; 1 = uniform weights.",
        _RC_TOKENS,
        _RC,
    ),
    (
        "rollout_corr/rollout_is_seq_{is_seq_stat}",
        "Per response, the mean applied weight over its tokens; then their mean, std (unbiased, 0 for one response), max, min, or max_deviation = max |mean weight − 1|.",
        _RC_ROWS,
        _RC,
    ),
    (
        "rollout_corr/rollout_is_seq_fraction_{side}",
        "Share of responses whose raw mean weight is above u (high) or below the lower threshold (low; 1/u for TIS).",
        _RC_ROWS,
        _RC,
    ),
    (
        "rollout_corr/rollout_is_oob_ratio",
        "IcePop ('lo_hi' threshold): share of weights outside [lo, hi], set to 0.",
        _RC_TOKENS,
        _RC,
    ),
    (
        "rollout_corr/rollout_is_batch_norm_factor",
        "rollout_is_batch_normalize: the mean the weights were divided by (token mode: over the tokens; sequence mode: of the responses' mean weights); 1 when that mean is ≤ 1e-8.",
        "response tokens or non-empty responses, by mode" + _RC_WHERE,
        _RC,
    ),
    # --- rollout correction: rejection sampling (rollout_rs), per option and overall ---
    (
        "rollout_corr/rollout_rs_{rs_option}_{rs_token_stat}",
        "The option's statistic s (k1 = −log r, k2 = ½(log r)², k3 = r − 1 − log r per token; a seq_* option's response sum, mean or max on each of its tokens): mean, or std of s clamped to the option's bounds (k1: [log lo, log hi]; k2/k3: [0, hi]; 0 with fewer than 2 tokens).",
        _RC_TOKENS,
        _RC,
    ),
    (
        "rollout_corr/rollout_rs_{rs_option}_{rs_extreme}",
        "Max / min of the option's statistic, and the share above its upper bound (fraction_high) or below its lower bound (fraction_low; k1 only, else 0).",
        _RS_TOKENS_OR_ROWS,
        _RC,
    ),
    (
        "rollout_corr/rollout_rs_{rs_option}_seq_{rs_seq_stat}",
        "Per response, the option's value (seq_* options) or the mean of its token values (token_* options); then their mean, std (unbiased), max, min, max_deviation = max |value|, or the share above the upper / below the lower bound (seq_fraction_low for k1 options only).",
        _RC_ROWS,
        _RC,
    ),
    (
        "rollout_corr/rollout_rs_{rs_option}_masked_fraction",
        "Share of response tokens this option rejects.",
        _RC_TOKENS,
        _RC,
    ),
    (
        "rollout_corr/rollout_rs_{rs_option}_seq_masked_fraction",
        "Share of responses with at least one token this option rejects.",
        _RC_ROWS,
        _RC,
    ),
    (
        "rollout_corr/rollout_rs_masked_fraction",
        "Share of response tokens rejected by any option (removed from the response mask).",
        _RC_TOKENS,
        _RC,
    ),
    (
        "rollout_corr/rollout_rs_seq_masked_fraction",
        "Share of responses with at least one rejected token.",
        _RC_ROWS,
        _RC,
    ),
    # --- rollout correction: the mismatch between π_train and π_rollout ---
    (
        "rollout_corr/kl",
        "KL(π_rollout ‖ π_train) estimate: mean(log π_rollout − log π_train).",
        _RC_TOKENS,
        _RC,
    ),
    (
        "rollout_corr/k3_kl",
        "The same KL by the k3 estimator: mean(r − log r − 1), r = π_train/π_rollout.",
        _RC_TOKENS,
        _RC,
    ),
    (
        "rollout_corr/{policy}_ppl",
        "Perplexity of the responses under π_train (training) or π_rollout (rollout): the mean over responses of exp(−mean token log-prob).",
        _RC_ROWS,
        _RC,
    ),
    (
        "rollout_corr/{policy}_log_ppl",
        "As {policy}_ppl in log space: the mean over responses of −mean token log-prob.",
        _RC_ROWS,
        _RC,
    ),
    (
        "rollout_corr/log_ppl_diff",
        "Mean over responses of d = mean log π_rollout − mean log π_train (log of the training / rollout perplexity ratio).",
        _RC_ROWS,
        _RC,
    ),
    ("rollout_corr/log_ppl_abs_diff", "Mean over responses of |d|.", _RC_ROWS, _RC),
    (
        "rollout_corr/log_ppl_diff_{is_extreme}",
        "Largest / smallest d over the responses.",
        _RC_ROWS,
        _RC,
    ),
    ("rollout_corr/ppl_ratio", "Mean over responses of exp(d).", _RC_ROWS, _RC),
    (
        "rollout_corr/chi2_token",
        "χ² divergence per token: E[r²] − 1, r = exp(clamp(log r, −20, 20)).",
        _RC_TOKENS,
        _RC,
    ),
    (
        "rollout_corr/chi2_seq",
        "χ² divergence per response: E[exp(2 · clamp(Σ log r, −20, 20))] − 1.",
        _RC_ROWS,
        _RC,
    ),
    # --- critic ---
    (
        "critic/vf_loss",
        "Clipped value loss 0.5 · max((V − R)², (clip(V) − R)²) under loss_agg_mode.",
        "loss_agg_mode denominators, as actor/pg_loss",
        "update_critic",
    ),
    (
        "critic/vf_clipfrac",
        "Fraction of response tokens where the clipped value error was the larger one.",
        "response tokens of each micro-batch, averaged over micro-batches",
        "update_critic",
    ),
    (
        "critic/vpred_mean",
        "Mean value prediction of the critic during its update.",
        "response tokens of each micro-batch, averaged over micro-batches",
        "update_critic",
    ),
    (
        "critic/grad_norm",
        "Global L2 norm of the critic gradients before clipping.",
        "none (a norm over all parameters)",
        "update_critic",
    ),
    (
        "critic/lr",
        "Critic learning rate after the scheduler step.",
        "none (a setting)",
        "update_critic",
    ),
    # --- balance, reward, training ---
    (
        "global_seqlen/{seqlen_stat}",
        "Token load (attention-mask sums) per DP rank: min/max/minmax_diff over contiguous chunks in the original order, balanced_min/balanced_max over the balanced partitions, mean = total / dp size.",
        "DP ranks (k partitions)",
        "balance",
    ),
    (
        "reward/error_count",
        "Samples whose scorer raised this step (they get the defined fallback score).",
        "none (a count of the step's samples)",
        "reward",
    ),
    (
        "reward/timeout_count",
        "Samples whose scorer ran past its per-sample timeout.",
        "none (a count of the step's samples)",
        "reward",
    ),
    (
        "reward/invalid_count",
        "Samples whose scorer returned NaN or a non-numeric score.",
        "none (a count of the step's samples)",
        "reward",
    ),
    ("training/global_step", "The global step number (1-based).", "none (a counter)", "step flow"),
    (
        "training/epoch",
        "The epoch this step's batch came from (0-based).",
        "none (a counter)",
        "step flow",
    ),
    # --- validation ---
    (
        "{section}/{data_source}/{var}/mean@{n}",
        "Mean of the variable over a prompt's N validation samples; val-core for the core variable (acc, else reward) at the largest N.",
        "N samples per prompt, " + _PER_UID,
        _VAL,
    ),
    (
        "{section}/{data_source}/{var}/std@{n}",
        "Population std (numpy, ddof = 0) of the variable over a prompt's N samples, only for N > 1. Not GRPO's in-group std, which is the sample std (ddof = 1, singleton = 1).",
        "N samples per prompt (divides by N, not N − 1), " + _PER_UID,
        _VAL,
    ),
    (
        "{section}/{data_source}/{var}/best@{k}/{mean_or_std}",
        "Bootstrap best-of-k: max of k samples drawn with replacement from a prompt's N, over 1000 resamples (seed 42); mean or population std of those maxima.",
        "1000 resamples per prompt, " + _PER_UID,
        _VAL,
    ),
    (
        "{section}/{data_source}/{var}/worst@{k}/{mean_or_std}",
        "Bootstrap worst-of-k: min of k resampled values, over 1000 resamples (seed 42); mean or std.",
        "1000 resamples per prompt, " + _PER_UID,
        _VAL,
    ),
    (
        "{section}/{data_source}/{var}/maj@{k}/{mean_or_std}",
        "Bootstrap majority vote of k: the value of the most frequent `pred` in each resample (ties → the pred drawn first), over 1000 resamples (seed 42); only when `pred` is reported.",
        "1000 resamples per prompt, " + _PER_UID,
        _VAL,
    ),
    (
        "val-aux/num_turns/{stat}",
        "Conversation turns per validation sample.",
        "all validation samples",
        "split_val_core_aux",
    ),
    # --- the reward stage ---
    (
        "reward/score_mean",
        "Mean sequence score the reward stage computed this step (reward loop plus reward model, before it is placed at the last response token).",
        "rows with a non-empty response; NaN if there are none",
        "reward stage",
    ),
    (
        "reward/aborted_count",
        "Rows with an empty response, which get no score written (a count, not a mean).",
        "none (a count of rows)",
        "reward stage",
    ),
    (
        "reward/time_s",
        "Wall time of scoring the step's batch (reward model and scorer pool), in seconds; with reward.score_in_rollout the time the rollout's scoring thread spent scoring, overlapped with generation.",
        "none (one value per step)",
        "reward stage, or the rollout stage with reward.score_in_rollout",
    ),
    (
        "reward/in_rollout_wait_s",
        "With reward.score_in_rollout in an agent rollout: seconds the rollout waited for the scores after its last generation round (the scoring time not hidden behind generation).",
        "none (one value per step)",
        "rollout stage (agent loop)",
    ),
    (
        "reward/skipped",
        "1 when the batch already carried rm_scores (e.g. streamed by the rollout) and the stage scored nothing.",
        "none (a flag)",
        "reward stage",
    ),
    (
        "reward/baseline_mean",
        "ReMax only: mean of the baselines, the sequence scores of the prompts' greedy responses (Σ_t rm_scores; 0 for an empty response), scored by the same reward route as the samples.",
        "prompt groups (uids) of the step, each greedy response once",
        "baseline_reward stage",
    ),
    (
        "reward_model/score_mean",
        "Mean reward-model score (the value head at the last valid token) of the scored rows.",
        "real (non-padding) rows scored by the reward model",
        "reward model",
    ),
    (
        "reward_model/num_rows",
        "Rows the reward model scored this step.",
        "none (a count of rows)",
        "reward model",
    ),
    # --- agent loop (stages.agent.metrics) ---
    (
        "agent/rounds",
        "Generation rounds (actor generate_sequences calls) the agent rollout took: the most assistant turns of a trajectory.",
        "none (a count of rounds)",
        _AGENT,
    ),
    (
        "agent/stop/{stop_reason}",
        "Fraction of trajectories that ended for that reason (length: the response budget is full; no_tool_call: a turn made no call; tool_response_too_long / user_turn_too_long: a tool or interaction turn did not fit and was not appended; single_turn: the row's loop has no tools; max_*: a turn limit; interaction_done: the interaction ended it; interaction_error: its interaction failed).",
        "trajectories (rows) of the rollout",
        _AGENT,
    ),
    ("agent/tool_calls", "Tool calls that ran this step.", "none (a count of calls)", _AGENT),
    (
        "agent/dropped_calls",
        "Calls of a turn past multi_turn.max_parallel_calls, not run (verl drops them silently).",
        "none (a count of calls)",
        _AGENT,
    ),
    (
        "agent/malformed_calls",
        "Tool-call blocks of the model's turns that the parser (multi_turn.format) could not read.",
        "none (a count of blocks)",
        _AGENT,
    ),
    (
        "agent/tool_seconds/{stat}",
        "Wall time of one tool call in its sandbox process: mean or max.",
        "tool calls that ran this step",
        _AGENT,
    ),
    (
        "agent/tool_response_tokens/{stat}",
        "Tool-turn tokens (response_mask 0 within the response: tool results and the chat template's turn markers) per trajectory.",
        "trajectories (rows) of the rollout",
        _AGENT,
    ),
    ("agent/tool/{tool}/calls", "Calls of that tool that ran.", "none (a count of calls)", _AGENT),
    (
        "agent/tool/{tool}/errors",
        "Calls of that tool whose result was not ok (raised, died, timed out, invalid result, unknown tool, bad arguments); their error text is the tool turn.",
        "none (a count of calls)",
        _AGENT,
    ),
    (
        "agent/tool/{tool}/timeouts",
        "Calls of that tool killed at multi_turn.sandbox.timeout_s.",
        "none (a count of calls)",
        _AGENT,
    ),
    (
        "system/{system_metric}",
        "MLflow's own system metrics (CPU and memory use, disk, network, and per-GPU use, memory and power where pynvml finds GPUs), machine-wide, not only ppoflow's processes. Their step is the sample's index, not the training step.",
        "one sample: the mean of the readings over ppoflow.mlflow_system_metrics_interval_s seconds",
        "mlflow sink (mlflow.system_metrics)",
    ),
    # --- learning signal (stages/metrics/signal.py) and dynamic sampling (flows/gen_rounds.py) ---
    (
        "signal/zero_reward_spread_group_frac",
        "Fraction of prompt groups whose samples all got the same score (seq_scores: Σ_t rm_scores, before any KL; population std 0): with a group-relative estimator their advantages are 0. Logged every step, with or without dynamic sampling.",
        "groups of the training batch with ≥ 2 samples (signal/multi_sample_groups); NaN if none (rollout.n = 1)",
        _SIGNAL,
    ),
    (
        "signal/multi_sample_groups",
        "Prompt groups of the training batch with at least 2 samples: the denominator of signal/zero_reward_spread_group_frac.",
        "none (a count of groups)",
        _SIGNAL,
    ),
    (
        "signal/zero_adv_sample_frac",
        "Fraction of samples whose advantage is 0 at every response token; 1.0 = the policy gradient of the step is zero (a warning line says so).",
        "samples with ≥ 1 response token (signal/response_samples); NaN if none",
        _SIGNAL,
    ),
    (
        "signal/response_samples",
        "Samples of the training batch with at least one response token: the denominator of signal/zero_adv_sample_frac.",
        "none (a count of samples)",
        _SIGNAL,
    ),
    (
        "train/num_gen_batches",
        "Generation rounds the step ran (verl's DAPO recipe's name): 1 without dynamic sampling, else the rounds of data.gen_batch_size prompts it took to keep data.train_batch_size groups.",
        "none (a count of rounds)",
        _SIGNAL,
    ),
    (
        "training/filter_groups/generated_samples",
        "Samples generated over the step's generation rounds (dynamic sampling only).",
        "none (a count of samples)",
        _ROUNDS,
    ),
    (
        "training/filter_groups/evicted_samples",
        "Samples of the groups dynamic sampling dropped (filter_groups.metric had zero spread), over the step's rounds (verl 0.9.1's name).",
        "none (a count of samples)",
        _ROUNDS,
    ),
    (
        "training/filter_groups/discarded_surplus_samples",
        "Samples of kept groups trimmed off because more than data.train_batch_size groups were kept (the last rounds' surplus; verl 0.9.1's name).",
        "none (a count of samples)",
        _ROUNDS,
    ),
    (
        "reward_model/num_pad_rows",
        "Padding rows added so the batch divides over the reward model's ranks (excluded from every score).",
        "none (a count of rows)",
        "reward model",
    ),
]
for _pattern, _what, _denominator, _source in _ENTRIES:
    METRICS.add(_pattern, MetricDoc(_pattern, _what, _denominator, _source))
_COMPILED = [(METRICS.get(pattern), METRICS.get(pattern).regex()) for pattern, *_ in _ENTRIES]

#: The catalog names a PPO training step logs at every step, by the condition under which it logs
#: them (:func:`step_metric_names`). Patterns expand over their placeholders' words.
STEP_METRICS = {
    "always": (
        *(f"critic/{name}/{{stat}}" for name in ("score", "rewards", "advantages", "returns")),
        "response_length/{length_stat}",
        "response_length_non_aborted/{length_stat}",
        "response/aborted_ratio",
        "prompt_length/{length_stat}",
        *(f"timing_s/{timer}" for timer in ("gen", "reward", "old_log_prob", "adv", "step")),
        "timing_per_token_ms/gen",
        "timing_per_token_ms/adv",
        "perf/total_num_tokens",
        "perf/time_per_step",
        "perf/throughput",
        "reward/error_count",
        "reward/timeout_count",
        "reward/invalid_count",
        "training/global_step",
        "training/epoch",
        "signal/zero_reward_spread_group_frac",
        "signal/multi_sample_groups",
        "signal/zero_adv_sample_frac",
        "signal/response_samples",
        "train/num_gen_batches",
        "lineage/staleness/{stat}",
    ),
    "rollout_apart": (
        "timing_s/rollout_wait",
        "timing_s/param_sync",
        "fully_async/count/dropped_stale_samples",
    ),
    "partial_rollout": (
        "fully_async/partial/total_partial_num",
        "fully_async/partial/partial_ratio",
        "fully_async/partial/max_partial_span",
    ),
    "filter_groups": (
        "training/filter_groups/generated_samples",
        "training/filter_groups/evicted_samples",
        "training/filter_groups/discarded_surplus_samples",
    ),
    "actor_update": (
        "timing_s/update_actor",
        "timing_per_token_ms/update_actor",
        *(f"actor/{name}" for name in ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl")),
        "actor/grad_norm",
        "actor/lr",
    ),
    "old_log_prob_recompute": ("actor/entropy",),
    "entropy_in_update": ("actor/entropy",),
    "balance": ("timing_s/balance", "global_seqlen/{seqlen_stat}"),
    "critic": (
        "critic/values/{stat}",
        "critic/vf_explained_var",
        *(f"timing_s/{timer}" for timer in ("values", "update_critic")),
        *(f"timing_per_token_ms/{timer}" for timer in ("values", "update_critic")),
        *(f"critic/{name}" for name in ("vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm", "lr")),
    ),
    "reference": ("timing_s/ref", "timing_per_token_ms/ref"),
    "kl_in_reward": ("actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"),
    "kl_loss": ("actor/kl_loss", "actor/kl_coef"),
    "remax": ("timing_s/baseline_rollout", "timing_s/baseline_reward", "reward/baseline_mean"),
    "rollout_correction": (
        "timing_s/rollout_correction",
        *(f"rollout_corr/{name}" for name in ("kl", "k3_kl", "log_ppl_diff", "log_ppl_abs_diff")),
        "rollout_corr/{policy}_ppl",
        "rollout_corr/{policy}_log_ppl",
        "rollout_corr/log_ppl_diff_{is_extreme}",
        *(f"rollout_corr/{name}" for name in ("ppl_ratio", "chi2_token", "chi2_seq")),
    ),
    "rollout_is": (
        "timing_s/rollout_is",
        "rollout_corr/rollout_is_mean",
        "rollout_corr/rollout_is_{is_extreme}",
        "rollout_corr/rollout_is_ratio_fraction_{side}",
        "rollout_corr/rollout_is_std",
        "rollout_corr/rollout_is_eff_sample_size",
        "rollout_corr/rollout_is_seq_{is_seq_stat}",
        "rollout_corr/rollout_is_seq_fraction_{side}",
    ),
}
_WORD_LIST = re.compile(r"[A-Za-z0-9_]+(?:\|[A-Za-z0-9_]+)*")


def expand_pattern(pattern: str) -> list[str]:
    """Every concrete name of ``pattern``; its placeholders must be word lists (``{stat}``).

    Example:
        >>> expand_pattern("critic/score/{stat}")
        ['critic/score/mean', 'critic/score/max', 'critic/score/min']
        >>> expand_pattern("timing_s/{stage}")
        Traceback (most recent call last):
        ...
        ValueError: pattern 'timing_s/{stage}': placeholder {stage} matches '.+', not a list of words; name the values instead
    """
    names = [""]
    last = 0
    for match in _PLACEHOLDER.finditer(pattern):
        choices = PLACEHOLDERS[match[1]]
        if not _WORD_LIST.fullmatch(choices):
            raise ValueError(
                f"pattern {pattern!r}: placeholder {{{match[1]}}} matches {choices!r}, not a list "
                "of words; name the values instead"
            )
        prefix = pattern[last : match.start()]
        names = [name + prefix + word for name in names for word in choices.split("|")]
        last = match.end()
    return [name + pattern[last:] for name in names]


def step_metric_names(
    *,
    use_critic: bool,
    use_reference_policy: bool,
    balance_batch: bool,
    use_kl_in_reward: bool,
    use_kl_loss: bool,
    updates_actor: bool = True,
    remax: bool = False,
    recomputes_old_log_probs: bool = True,
    rollout_correction: bool = False,
    rollout_is: bool = False,
    filter_groups: bool = False,
    rollout_apart: bool = False,
    partial_rollout: bool = False,
) -> list[str]:
    """The names a PPO step with these settings logs every step (:data:`STEP_METRICS`).

    The flags are the config's (``cfg.derived.use_critic``, ``cfg.derived.use_reference_policy``,
    ``trainer.balance_batch``, ``algorithm.use_kl_in_reward``, ``actor.use_kl_loss``);
    ``updates_actor`` is False for the steps before ``trainer.critic_warmup``; ``remax`` is the
    estimator entry's ``needs_greedy_baseline`` (ReMax's baseline stages run);
    ``recomputes_old_log_probs`` is ``not algorithm.rollout_correction.bypass_mode`` (the actor's
    old_log_prob pass, which measures ``actor/entropy``, runs; without it the actor's update
    measures it); ``rollout_correction`` is the same
    condition for the rollout_correction stage's mismatch metrics, and ``rollout_is`` adds the
    rollout_is stage's weight metrics (decoupled mode with ``rollout_is``); ``filter_groups``
    adds dynamic sampling's counts (``algorithm.filter_groups.enable``), ``rollout_apart`` the
    timings of a schedule with rollouts launched ahead (``stages.schedules``, ``rollout_apart``),
    ``partial_rollout`` the partial rollouts' counts (``async_training.partial_rollout``). Multi-turn and
    tool-call statistics, validation and MFU metrics are not every-step metrics and are not listed.

    Example:
        >>> names = step_metric_names(use_critic=False, use_reference_policy=False,
        ...     balance_batch=True, use_kl_in_reward=False, use_kl_loss=False)
        >>> "actor/ppo_kl" in names, "critic/vf_loss" in names, "global_seqlen/balanced_max" in names
        (True, False, True)
    """
    conditions = {
        "always": True,
        "actor_update": updates_actor,
        "balance": balance_batch,
        "critic": use_critic,
        "reference": use_reference_policy,
        "kl_in_reward": use_kl_in_reward,
        "kl_loss": use_kl_loss and updates_actor,
        "remax": remax,
        "old_log_prob_recompute": recomputes_old_log_probs,
        "entropy_in_update": updates_actor and not recomputes_old_log_probs,
        "rollout_correction": rollout_correction,
        "rollout_is": rollout_is,
        "filter_groups": filter_groups,
        "rollout_apart": rollout_apart,
        "partial_rollout": partial_rollout,
    }
    return [
        name
        for condition, patterns in STEP_METRICS.items()
        if conditions[condition]
        for pattern in patterns
        for name in expand_pattern(pattern)
    ]


def find_metric_doc(name: str) -> MetricDoc | None:
    """The catalog entry of a concrete metric name, or None.

    Entries without placeholders win; otherwise the first pattern (catalog order) that matches.
    A sanitized MLflow name is restored first when it is not found as is.
    """
    for candidate in dict.fromkeys([name, restore_metric_name(name)]):
        if candidate in METRICS:
            return METRICS.get(candidate)
        for doc, regex in _COMPILED:
            if regex.fullmatch(candidate):
                return doc
    return None


def describe_metric(name: str) -> str:
    """One line: what ``name`` measures and its denominator; ``KeyError`` naming it if unknown.

    Example:
        >>> describe_metric("response_length/mean").split(". Denominator: ")[1]
        'all real (non-padding) rows of the batch, zero-length (aborted) rows included.'
        >>> "ddof = 0" in describe_metric("val-core/openai/gsm8k/acc/std@4")
        True
        >>> describe_metric("actor/no_such_metric")
        Traceback (most recent call last):
        ...
        KeyError: "no description for metric 'actor/no_such_metric'; add a MetricDoc to stages/metrics/catalog.py"
    """
    doc = find_metric_doc(name)
    if doc is None:
        raise KeyError(
            f"no description for metric {name!r}; add a MetricDoc to stages/metrics/catalog.py"
        )
    return doc.description()


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """The catalog as a Markdown table (Metric | Measures | Denominator | Emitted by).

    Example:
        >>> markdown_table().splitlines()[0]
        '| Metric | Measures | Denominator | Emitted by |'
    """
    lines = ["| Metric | Measures | Denominator | Emitted by |", "|---|---|---|---|"]
    for pattern, *_ in _ENTRIES:
        doc = METRICS.get(pattern)
        cells = [f"`{doc.pattern}`", doc.what, doc.denominator, doc.emitted_by]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines)
