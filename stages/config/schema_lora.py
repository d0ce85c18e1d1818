"""verl's LoRA keys of a role's model (``actor_rollout_ref.model.*``, ``critic.model.*``).

Two spellings, both verl 0.9.1's, with verl's defaults:

* the flat keys (verl's FSDP engine): ``lora_rank`` (0 = off), ``lora_alpha`` 16,
  ``target_modules`` ``all-linear``, ``exclude_modules`` null, ``lora_adapter_path`` null;
* the ``lora:`` block (verl's Megatron engine): ``type`` lora, ``rank`` 0, ``alpha`` 32,
  ``dropout`` 0, ``target_modules`` Megatron's names (``linear_qkv``, ``linear_proj``,
  ``linear_fc1``, ``linear_fc2``: read as the Hugging Face modules they are), ``exclude_modules``
  [], ``lora_A_init_method`` xavier, ``lora_B_init_method`` zero, ``adapter_path`` null.

The block's other keys (``merge``, ``dropout_position``, ``dtype``, ``a2a_experimental``, the
``freeze_*`` switches) are read by ``verl_keys.yaml``: accepted with a notice, or at verl's default
only. :func:`stages.engines.adapters.adapter_settings` turns either spelling into the adapter the
engines build; ``stages.config.checks_lora`` holds the rules between them and the rest of the run.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from stages.config._base import ConfigModel
from stages.config.choices import check_registered
from stages.engines.adapters import ADAPTER_VARIANTS, NOT_IMPLEMENTED_VARIANTS

MEGATRON_DEFAULT_TARGETS = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


def _variant(name: str) -> str:
    return check_registered(
        name, ADAPTER_VARIANTS.names(), "LoRA variant", NOT_IMPLEMENTED_VARIANTS
    )


#: ``lora.type``: a name in ``stages.engines.adapters.ADAPTER_VARIANTS``
AdapterVariantName = Annotated[str, AfterValidator(_variant)]


class LoraBlockConfig(ConfigModel):
    """verl's ``lora:`` block: the adapter in Megatron's spelling (and the variant for both)."""

    type: AdapterVariantName = Field(
        "lora",
        description="LoRA variant, a name in stages.engines.adapters.ADAPTER_VARIANTS (lora, dora); also the variant of the flat lora_rank keys [ppoflow: verl's FSDP reads it only in this block] (name)",
    )
    rank: int = Field(0, ge=0, description="Adapter rank r; 0 = off unless adapter_path (rank)")
    alpha: float = Field(32, gt=0, description="LoRA α: the update is scaled by α / r (scale)")
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapter's input; also applies to the flat lora_rank keys (probability)",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(MEGATRON_DEFAULT_TARGETS),
        description="Modules that get adapters; Megatron's linear_qkv / linear_proj / linear_fc1 / linear_fc2 are read as q/k/v_proj, o_proj, gate/up_proj, down_proj (names)",
    )
    exclude_modules: list[str] = Field(
        default_factory=list, description="Modules left without adapters (names)"
    )
    lora_A_init_method: Literal["xavier", "kaiming"] = Field(
        "xavier", description="Initialisation of lora_A (Megatron's default: xavier) (choice)"
    )
    lora_B_init_method: Literal["zero"] = Field(
        "zero",
        description="Initialisation of lora_B: zero, so training starts at the base (choice)",
    )
    adapter_path: str | None = Field(
        None, description="PEFT adapter directory to start from; null = a fresh adapter (path)"
    )


class LoraKeys(ConfigModel):
    """The flat LoRA keys and the ``lora:`` block of a role's model config."""

    lora_rank: int = Field(
        0,
        ge=0,
        description="LoRA adapter rank: > 0 trains adapters instead of the weights (the base frozen in the model's dtype); 0 = full training (rank)",
    )
    lora_alpha: float = Field(16, gt=0, description="LoRA α: the update is scaled by α / r (scale)")
    target_modules: str | list[str] = Field(
        "all-linear",
        description="Modules that get adapters: names, or all-linear (every linear layer but the output head) (names)",
    )
    exclude_modules: str | list[str] | None = Field(
        None, description="Modules left without adapters; null = none (names)"
    )
    lora_adapter_path: str | None = Field(
        None,
        description="PEFT adapter directory to start from (trained further; rank and targets its own); null = a fresh adapter (path)",
    )
    lora: LoraBlockConfig = Field(
        default_factory=LoraBlockConfig,
        description="verl's lora: block (Megatron's spelling); use it or the flat keys (section)",
    )
