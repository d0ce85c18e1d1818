"""Model engines: DeepSpeed ZeRO actor / critic / reference workers and rollout backends.

Submodules import their heavy dependencies (DeepSpeed, vLLM) lazily or on import of that
submodule only, so ``import stages.engines`` stays cheap.
"""
