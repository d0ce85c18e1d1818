"""ppoflow's own tools (verl's interface, :mod:`stages.agent.tool_api`), named by class path in a
tool config (:mod:`stages.agent.tool_config`):

- :mod:`stages.agent.tools.gsm8k` — ``Gsm8kTool``, verl's ``verl.tools.gsm8k_tool.Gsm8kTool``;
- :mod:`stages.agent.tools.python_exec` — ``PythonExecTool``: runs model-written Python in the
  sandbox's process (verl's ``SandboxFusionTool`` maps to it);
- :mod:`stages.agent.tools.lookup` — ``LookupTool``: a fixed key → value table.

Importing this package imports nothing else.
"""
