"""Agentic rollouts: multi-turn trajectories that alternate model turns and tool turns.

- :mod:`stages.agent.parsers` — tool-call parsers (``multi_turn.format``), e.g. ``hermes``;
- :mod:`stages.agent.chat_delta` — the token ids a tool turn appends (the chat template's
  delta), never re-tokenizing what the model sampled;
- :mod:`stages.agent.tool_api` / :mod:`stages.agent.tool_config` — verl's tool interface and
  its tool-config YAML;
- :mod:`stages.agent.sandbox` — each tool call in a supervised process with time, memory and
  output limits and no network;
- :mod:`stages.agent.loop` — the agent loop's state machine over token ids;
- :mod:`stages.agent.trajectory` — finished trajectories as the rollout's batch.

Importing this package imports nothing else.
"""
