"""ppoflow's stages: one module per stage of a PPO step, and what the stages need (``algos``,
``config``, ``data``, ``engines``, ``metrics``, ``reward``). Importing the package changes nothing
in the process."""
