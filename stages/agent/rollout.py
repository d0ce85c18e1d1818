"""The rollout stage's agent path: the agent loop driven turn by turn through the actor engine.

When a row of the step runs an agent loop that uses tools (its ``agent_name``, else the config's
default, :func:`row_agents`), the whole batch goes through :func:`agent_rollout` instead of one
``generate_sequences`` call: every round is one ``generate_sequences`` call on the live
trajectories (left-padded to their longest, ``max_new_tokens`` = the largest remaining budget),
so both backends serve it unchanged — HF continues each row from its ids, vLLM takes the ids in
and gives ids out — and the stage reads the actor's weights exactly as the one-call rollout does.

The run's :class:`AgentRuntime` (``ctx.engines["agent"]``, built at start-up by
:func:`build_agent_engines`) holds what the loop needs besides the engine: the tokenizer, the
parser of ``multi_turn.format``, the chat template's delta for tool turns and the tool sandbox
(whose zygote imports the tool classes at start-up, so a missing class is one line then).

Sampling seeds: round k of step s samples with ``step_seed(trainer.seed, s, "rollout")`` for
k = 0 and ``step_seed(trainer.seed, s, "rollout/turn<k>")`` after, so a step samples the same
trajectories in an uninterrupted run, a resumed one and a re-run (given the same tool results).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensordict import TensorDict

from dataproto import DataProto
from dataproto import keys as K
from stages.agent.agents import AGENT_LOOPS, AGENT_NAME_KEY
from stages.agent.loop import GeneratedTurn, LoopLimits, Trajectory, run_agent_loop
from stages.agent.metrics import agent_metrics
from stages.agent.scoring import REWARD_LOOP_ENGINE, RolloutScorer, scored_delta, scores_in_rollout
from stages.agent.trajectory import trajectories_to_batch
from stages.engine_calls import get_engine, run_engine
from stages.stage import StageContext, round_purpose, step_seed

AGENT_ENGINE = "agent"  # ctx.engines key of the AgentRuntime
TOOL_AGENT = "tool_agent"


def default_agent(config: Any) -> str:
    """The loop of rows without ``agent_name``: ``tool_agent`` when ``multi_turn.enable``
    (a deliberate difference: verl ignores ``enable``), else ``agent.default_agent_loop``."""
    rollout = config.actor_rollout_ref.rollout
    return TOOL_AGENT if rollout.multi_turn.enable else rollout.agent.default_agent_loop


def row_agents(batch: DataProto, config: Any) -> list[str]:
    """(B,) each row's agent loop: its ``agent_name`` when set, else :func:`default_agent`."""
    default = default_agent(config)
    names = batch.non_tensor_batch.get(AGENT_NAME_KEY)
    if names is None:
        return [default] * len(batch)
    return [name if name is not None else default for name in names]


def uses_agent_loop(batch: DataProto, config: Any) -> bool:
    """Whether any row's agent loop uses tools (then the batch takes :func:`agent_rollout`)."""
    return any(AGENT_LOOPS.get(name).uses_tools for name in set(row_agents(batch, config)))


def may_use_tools(config: Any) -> bool:
    """Whether the run may need the tool sandbox: a tool or interaction config is given, or the
    default loop uses tools (rows naming ``tool_agent`` in a run without either get unknown-tool
    turns)."""
    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    return (
        bool(multi_turn.tool_config_path)
        or bool(multi_turn.interaction_config_path)
        or AGENT_LOOPS.get(default_agent(config)).uses_tools
    )


def tool_specs(config: Any) -> tuple[Any, ...]:
    """The tools of ``multi_turn.tool_config_path`` (none when unset)."""
    path = config.actor_rollout_ref.rollout.multi_turn.tool_config_path
    if not path:
        return ()
    from stages.agent.tool_config import load_tool_config

    return load_tool_config(path)


def interaction_specs(config: Any) -> tuple[Any, ...]:
    """The interactions of ``multi_turn.interaction_config_path``, as sandbox specs (none when
    unset; ``stages.agent.interactions``)."""
    path = config.actor_rollout_ref.rollout.multi_turn.interaction_config_path
    if not path:
        return ()
    from stages.agent.interactions import load_interaction_config

    return load_interaction_config(path)


def tool_modules(config: Any) -> tuple[str, ...]:
    """The modules of the tool and interaction classes of the config (verl names mapped to
    ppoflow's): the rollout's code beyond its imports, part of its cache key."""
    from stages.agent.interactions import VERL_INTERACTION_CLASSES
    from stages.agent.tool_config import VERL_TOOL_CLASSES

    targets = [VERL_TOOL_CLASSES.get(s.class_name, s.class_name) for s in tool_specs(config)]
    for spec in interaction_specs(config):
        inner = spec.config["class_name"]
        targets += [spec.class_name, VERL_INTERACTION_CLASSES.get(inner, inner)]
    return tuple(sorted({target.rpartition(".")[0] for target in targets}))


def tool_schemas(config: Any) -> list[dict] | None:
    """The OpenAI function schemas rendered into every prompt (None without tools)."""
    return [spec.schema for spec in tool_specs(config)] or None


class AgentRuntime:
    """What the agent loop needs for a run besides the actor: tokenizer, parser, chat delta
    and the tool sandbox (module docstring). Close it with :meth:`close`."""

    def __init__(self, config: Any, tokenizer: Any) -> None:
        from stages.agent.chat_delta import ChatDelta
        from stages.agent.parsers import TOOL_PARSERS
        from stages.agent.sandbox import ToolSandbox

        multi_turn = config.actor_rollout_ref.rollout.multi_turn
        self.tokenizer = tokenizer
        self.specs = tool_specs(config)
        self.parser = TOOL_PARSERS.get(multi_turn.format)
        self.chat_delta = ChatDelta(tokenizer, [spec.schema for spec in self.specs] or None)
        eos = tokenizer.eos_token_id
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else eos)
        box = multi_turn.sandbox
        self.interactions = {spec.name: spec for spec in interaction_specs(config)}
        self.sandbox = ToolSandbox(
            (*self.specs, *self.interactions.values()),
            num_workers=box.num_workers,
            timeout_s=box.timeout_s,
            memory_mb=box.memory_mb,
            output_bytes=box.output_bytes,
            allow_network=box.allow_network,
            startup_timeout_s=box.startup_timeout_s,
        )

    def parse(self, ids: list[int]) -> Any:
        """The turn's text (special tokens kept, as verl decodes it) through the parser."""
        return self.parser.parse(self.tokenizer.decode(ids, skip_special_tokens=False))

    def make_call(self, name: str, arguments: str, tools_kwargs: dict[str, Any]) -> Any:
        from stages.agent.sandbox import ToolCall

        kwargs = tools_kwargs.get(name) or {}
        return ToolCall(name, arguments, dict(kwargs.get("create_kwargs") or {}))

    def decode(self, ids: list[int]) -> str:
        """An assistant turn's text for an interaction's messages (special tokens skipped)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def interact(
        self, requests: list[tuple[str, dict[str, Any], list[dict[str, Any]]]]
    ) -> list[Any]:
        """Each (interaction name, kwargs, messages) answered in the sandbox (one call each)."""
        import json

        from stages.agent.interactions import PREFIX, InteractionReply
        from stages.agent.sandbox import ToolCall

        calls = [
            ToolCall(PREFIX + name, json.dumps({"messages": messages}), dict(kwargs))
            for name, kwargs, messages in requests
        ]
        return [
            InteractionReply(
                result.text,
                result.reward,
                bool((result.metrics or {}).get("terminate", False)),
                result.status,
            )
            for result in self.sandbox.run(calls)
        ]

    def close(self) -> None:
        self.sandbox.close()


def build_agent_engines(config: Any, tokenizer: Any) -> dict[str, Any]:
    """Start-up: the :class:`AgentRuntime` when the run may use tools, keyed for
    ``StageContext.engines``."""
    return {AGENT_ENGINE: AgentRuntime(config, tokenizer)} if may_use_tools(config) else {}


def close_agent_engines(engines: dict[str, Any]) -> None:
    runtime = engines.get(AGENT_ENGINE)
    if runtime is not None:
        runtime.close()


def _left_padded(contexts: Sequence[list[int]], pad_id: int) -> DataProto:
    """(n, L) left-padded ``input_ids`` / ``attention_mask`` / ``position_ids`` of ``contexts``
    (L = the longest), laid out as the data loader lays out prompts."""
    from stages.data.tokenize import left_pad

    input_ids, attention_mask, position_ids = left_pad(
        contexts, pad_id, max(len(c) for c in contexts)
    )
    tensors = {
        K.INPUT_IDS: input_ids,
        K.ATTENTION_MASK: attention_mask,
        K.POSITION_IDS: position_ids,
    }
    return DataProto(
        batch=TensorDict(tensors, batch_size=[len(contexts)]), non_tensor_batch={}, meta_info={}
    )


def engine_generate(
    ctx: StageContext,
    pad_id: int,
    eos_ids: frozenset[int],
    validate: bool = False,
    base: str = "rollout",
):
    """A :data:`stages.agent.loop.GenerateFn` on the actor engine, seeded per round; ``base``
    is the first turn's seed purpose (``rollout``; ``rollout/round<r>`` in generation round
    r > 1 of dynamic sampling, :func:`~stages.stage.round_purpose`)."""
    rounds = iter(range(1 << 30))

    def generate(contexts: list[list[int]], max_new_tokens: int) -> list[GeneratedTurn]:
        k = next(rounds)
        purpose = base if k == 0 else f"{base}/turn{k}"
        out = run_engine(
            ctx,
            "actor",
            "generate_sequences",
            _left_padded(contexts, pad_id),
            validate=validate,
            seed=step_seed(ctx.config.trainer.seed, ctx.step, purpose),
            max_new_tokens=max_new_tokens,
        )
        lengths = out.batch[K.RESPONSE_MASK].sum(-1).tolist()  # (n,) sampled ids incl. EOS
        responses, log_probs = out.batch[K.RESPONSES], out.batch[K.ROLLOUT_LOG_PROBS]
        turns = []
        for row, length in enumerate(lengths):
            ids = responses[row, :length].tolist()
            ended = bool(ids) and ids[-1] in eos_ids
            turns.append(GeneratedTurn(ids, log_probs[row, :length].tolist(), ended))
        return turns

    return generate


def loop_limits(config: Any) -> LoopLimits:
    rollout = config.actor_rollout_ref.rollout
    multi_turn = rollout.multi_turn
    return LoopLimits(
        response_length=rollout.response_length,
        max_assistant_turns=multi_turn.max_assistant_turns,
        max_user_turns=multi_turn.max_user_turns,
        max_parallel_calls=multi_turn.max_parallel_calls,
        max_tool_response_length=multi_turn.max_tool_response_length,
        truncate_side=multi_turn.tool_response_truncate_side,
    )


def _tools_kwargs(batch: DataProto) -> list[dict[str, Any]]:
    """(B,) each row's ``extra_info["tools_kwargs"]`` (verl's per-sample tool arguments).

    Raises:
        ValueError: a row restricts its tools with ``extra_info["tool_selection"]``, which
            ppoflow does not implement (every row sees every tool of the config).
    """
    infos = batch.non_tensor_batch.get(K.EXTRA_INFO)
    if infos is None:
        return [{} for _ in range(len(batch))]
    for row, info in enumerate(infos):
        if (info or {}).get("tool_selection") is not None:
            raise ValueError(
                f"row {row}: extra_info.tool_selection (verl's per-sample tool subset) is not "
                "implemented in ppoflow; remove it (every row may call every tool of "
                "actor_rollout_ref.rollout.multi_turn.tool_config_path)"
            )
    return [dict((info or {}).get("tools_kwargs") or {}) for info in infos]


def _attach_interactions(trajectories: list[Trajectory], batch: DataProto, runtime: Any) -> None:
    """Give each row whose ``extra_info.interaction_kwargs`` names an interaction of the config
    that interaction, its kwargs and its prompt messages (``raw_prompt``).

    Raises:
        ValueError: a row names an interaction the config lacks, or the batch has no
            ``raw_prompt`` (``data.return_raw_chat``) to start the conversation from.
    """
    from stages.agent.interactions import PREFIX

    infos = batch.non_tensor_batch.get(K.EXTRA_INFO)
    if not runtime.interactions or infos is None:
        return
    prompts = batch.non_tensor_batch.get(K.RAW_PROMPT)
    for row, info in enumerate(infos):
        kwargs = dict((info or {}).get("interaction_kwargs") or {})
        if not kwargs:
            continue
        name = kwargs.get("name")
        if PREFIX + str(name) not in runtime.interactions:
            known = sorted(n.removeprefix(PREFIX) for n in runtime.interactions)
            raise ValueError(
                f"row {row}: extra_info.interaction_kwargs.name = {name!r} is not an "
                "interaction of actor_rollout_ref.rollout.multi_turn.interaction_config_path "
                f"({known})"
            )
        if prompts is None:
            raise ValueError(
                "interactions read the conversation's messages: set data.return_raw_chat=true "
                "so the batch carries raw_prompt"
            )
        trajectory = trajectories[row]
        trajectory.interaction = str(name)
        trajectory.interaction_kwargs = kwargs
        trajectory.messages = [dict(m) for m in prompts[row]]


def agent_rollout(
    batch: DataProto, prompts: DataProto, ctx: StageContext, validate: bool = False
) -> DataProto:
    """The rollout of :mod:`stages.agent.trajectory`'s layout for ``batch`` (its prompt tensors
    under the engine's names in ``prompts``); adds the ``agent/*`` metrics to ``ctx.metrics``.
    ``validate``: sample with ``rollout.val_kwargs.*`` (validation)."""
    runtime = ctx.engines.get(AGENT_ENGINE)
    if runtime is None:
        raise ValueError(
            "rows of this batch run a tool-using agent loop (agent_name or "
            "actor_rollout_ref.rollout.agent.default_agent_loop), but the run started no tool "
            "sandbox; set actor_rollout_ref.rollout.multi_turn.tool_config_path (or "
            "multi_turn.enable: true) so that it starts"
        )
    tokenizer = runtime.tokenizer
    input_ids, mask = prompts.batch[K.INPUT_IDS], prompts.batch[K.ATTENTION_MASK]
    agents = row_agents(batch, ctx.config)
    trajectories = [
        Trajectory(
            prompt_ids=input_ids[row][mask[row].bool()].tolist(),
            uses_tools=AGENT_LOOPS.get(agents[row]).uses_tools,
            tools_kwargs=kwargs,
        )
        for row, kwargs in enumerate(_tools_kwargs(batch))
    ]
    _attach_interactions(trajectories, batch, runtime)
    limits = loop_limits(ctx.config)
    scorer = None
    if not validate and scores_in_rollout(ctx.config):
        scorer = RolloutScorer(
            get_engine(ctx, REWARD_LOOP_ENGINE),
            batch,
            prompts.batch,
            limits.response_length,
            tokenizer.pad_token_id,
        )
    run_agent_loop(
        trajectories,
        limits,
        generate=engine_generate(
            ctx, tokenizer.pad_token_id, runtime.eos_ids, validate, round_purpose("rollout", batch)
        ),
        parse=runtime.parse,
        run_tools=runtime.sandbox.run,
        tool_turn_ids=runtime.chat_delta.tool_turn_ids,
        make_call=runtime.make_call,
        on_finished=None
        if scorer is None
        else lambda rows: scorer.submit(rows, [trajectories[i] for i in rows]),
        interact=runtime.interact,
        user_turn_ids=runtime.chat_delta.user_turn_ids,
        decode=runtime.decode,
    )
    ctx.metrics.update(agent_metrics(trajectories))
    out = trajectories_to_batch(
        prompts.batch, trajectories, limits.response_length, tokenizer.pad_token_id
    )
    if scorer is not None:
        result, waited = scorer.finish(len(trajectories))
        delta, metrics = scored_delta(result, out.batch[K.ATTENTION_MASK], limits.response_length)
        metrics |= {"reward/time_s": scorer.busy_s, "reward/in_rollout_wait_s": waited}
        ctx.metrics.update(metrics)
        out = out | delta
    return out
