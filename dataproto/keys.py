"""The one spelling of every batch key ppoflow reads or writes (verl's names where verl has them).

Shapes use the project legend: B samples, P prompt tokens, R response tokens, T = P + R.
Add a key here before using it anywhere else.
"""

# --- tensor layer (TensorDict, dim 0 = rows) ---
INPUT_IDS = "input_ids"  # (B, T) int64: prompts ‖ responses
ATTENTION_MASK = "attention_mask"  # (B, T) int64 {0,1}: prompt left-padded, response right-padded
POSITION_IDS = "position_ids"  # (B, T) int64
PROMPTS = "prompts"  # (B, P) int64, left-padded
RESPONSES = "responses"  # (B, R) int64, right-padded
RESPONSE_MASK = "response_mask"  # (B, R) int64 {0,1}: 1 on generated tokens incl. EOS
ROLLOUT_LOG_PROBS = "rollout_log_probs"  # (B, R) float32: sampler's log-probs of chosen tokens
OLD_LOG_PROBS = "old_log_probs"  # (B, R) float32: actor log-probs before the update
REF_LOG_PROB = "ref_log_prob"  # (B, R) float32: reference policy log-probs
VALUES = "values"  # (B, R) float32: critic values
RM_SCORES = "rm_scores"  # (B, R) float32: one score per row at its last valid response token
TOKEN_LEVEL_SCORES = "token_level_scores"  # (B, R) float32: rm_scores as the reward tensor
TOKEN_LEVEL_REWARDS = "token_level_rewards"  # (B, R) float32: scores minus the KL-in-reward term
ADVANTAGES = "advantages"  # (B, R) float32
RETURNS = "returns"  # (B, R) float32
SEQ_SCORES = "seq_scores"  # (B,) float32: each row's scalar score, aborted rows included
REWARD_BASELINES = "reward_baselines"  # (B,) float32: ReMax greedy-sample reward
BASELINE_RESPONSES = "baseline_responses"  # (B, R) int64: ReMax greedy response of the row's prompt
BASELINE_RESPONSE_MASK = "baseline_response_mask"  # (B, R) int64 {0,1}: its response mask
#: (B, R) int64: with partial rollouts, the policy version of the weights that chose each
#: column's token (flows/partial_rollout.py; on padding, the version of the column's segment)
ROLLOUT_POLICY_VERSIONS = "rollout_policy_versions"
ENTROPYS = "entropys"  # (B, R) float32: per-token entropy (dropped after old_log_prob)
#: (B, R) float32: decoupled rollout correction's detached IS weights (0 on padding)
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"
#: (B, R) {0,1} in response_mask's dtype: response_mask less the tokens rejection sampling rejects
ROLLOUT_RS_MASK = "rollout_rs_mask"
PROMPT_LENGTH = "prompt_length"  # (B,) int64, optional: precomputed valid prompt lengths
RESPONSE_LENGTH = "response_length"  # (B,) int64, optional: precomputed valid response lengths
PROMPT_INPUT_IDS = "prompt_input_ids"  # (B, P) int64: the step input's prompts, left-padded
PROMPT_ATTENTION_MASK = "prompt_attention_mask"  # (B, P) int64 {0,1}: the step input's prompt mask
PROMPT_POSITION_IDS = "prompt_position_ids"  # (B, P) int64: the step input's prompt positions
BALANCE_ORDER = (
    "balance_order"  # (B,) int64: the balance stage's row permutation (new row i = old row perm[i])
)

# --- non-tensor layer (numpy, dim 0 = rows) ---
UID = "uid"  # (B,) object str: the prompt group
DATA_SOURCE = "data_source"  # (B,) object str: routes the scorer (unless REWARD_ROUTE is set)
#: (B,) object str, only when data.reward_fn_key names another column: that column's value,
#: which the scorer gets as its data_source argument (verl's row[reward_fn_key])
REWARD_ROUTE = "reward_route"
REWARD_MODEL = "reward_model"  # (B,) object dict {style, ground_truth}
EXTRA_INFO = "extra_info"  # (B,) object dict
RAW_PROMPT = "raw_prompt"  # (B,) object list[dict]: chat messages
ABILITY = "ability"  # (B,) object str
INDEX = "index"  # (B,) object int: extra_info["index"] (0 when absent)
NUM_TURNS = "__num_turns__"  # (B,) int
TOOL_CALL_COUNTS = "tool_call_counts"  # (B,) int
IS_PAD = (
    "is_pad"  # (B,) bool: True on rows duplicated by pad_dataproto_to_divisor; metrics exclude them
)

# --- meta_info (per step) ---
TEMPERATURE = "temperature"  # float
GLOBAL_STEPS = "global_steps"  # int
GEN_ROUND = "gen_round"  # int: the generation round of a step with dynamic sampling (absent = 1)
GLOBAL_TOKEN_NUM = "global_token_num"  # list[int]: per-row attention-mask sums
METRICS = "metrics"  # dict[str, list | float]: merged specially by concat
REWARD_EXTRA_KEYS = "reward_extra_keys"  # list[str]: non-tensor keys holding reward extras
KL_COEF = "kl_coef"  # float: the KL-in-reward coefficient β of this step (the controller's value)
#: dict: bypass mode's algorithm.rollout_correction settings, handed to the actor's update
ROLLOUT_CORRECTION = "rollout_correction"

#: keys whose dim 1 is the response-token axis (R)
RESPONSE_TOKEN_KEYS = frozenset(
    {
        RESPONSES,
        RESPONSE_MASK,
        ROLLOUT_LOG_PROBS,
        ROLLOUT_POLICY_VERSIONS,
        OLD_LOG_PROBS,
        REF_LOG_PROB,
        VALUES,
        RM_SCORES,
        TOKEN_LEVEL_SCORES,
        TOKEN_LEVEL_REWARDS,
        ADVANTAGES,
        RETURNS,
        ENTROPYS,
        ROLLOUT_IS_WEIGHTS,
        ROLLOUT_RS_MASK,
        BASELINE_RESPONSES,
        BASELINE_RESPONSE_MASK,
    }
)
#: keys whose dim 1 is the full-sequence token axis (T) or the prompt axis (P)
SEQUENCE_TOKEN_KEYS = frozenset(
    {
        INPUT_IDS,
        ATTENTION_MASK,
        POSITION_IDS,
        PROMPTS,
        PROMPT_INPUT_IDS,
        PROMPT_ATTENTION_MASK,
        PROMPT_POSITION_IDS,
    }
)
