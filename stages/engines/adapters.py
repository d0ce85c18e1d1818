"""LoRA adapters on a role's model, through PEFT: the variants, their settings, the base, the merge.

A role (the actor, the critic) trains adapters instead of its weights when its model config turns
LoRA on, with verl's keys (``stages.config.schema_lora``): the flat ones (``lora_rank`` > 0 or a
``lora_adapter_path``), or the ``lora:`` block (``lora.rank`` > 0 or ``lora.adapter_path``).
:func:`adapter_settings` reads either spelling into one :class:`AdapterSettings`; the variant is
``lora.type``, an entry of :data:`ADAPTER_VARIANTS` that declares what it can do, so the config
checks and the engines ask the entry, never the name:

===========  ============================  =================  ======================
name         PEFT adapter                  reference_is_base  merges
===========  ============================  =================  ======================
``lora``     ``LoraConfig``                True               True (vLLM gets W+ΔW)
``dora``     ``LoraConfig(use_dora=True)``  True               False (HF rollouts)
===========  ============================  =================  ======================

``reference_is_base``: the adapters switch off (PEFT's ``disable_adapter``), so the reference
policy is the actor's own module with its adapters off: no reference model is built (verl's
``ref_in_actor``; ``derived.reference_in_actor``). ``merges``: the merged weight
W + (α/r)·B·A of every adapted layer is computed on the fly for the vLLM weight sync (the
trained adapter and the base are not touched); a variant without it runs HF rollouts only.

With an adapter the base weights are frozen (``requires_grad=False``) in the model's dtype and only
the adapter parameters reach the optimizer (``deepspeed_setup._make_optimizer`` takes the trainable
ones); a critic's value head (``score``) is trained beside its adapters (PEFT's
``modules_to_save`` for token classification). PEFT is imported on first use: reading a config
imports neither it nor transformers.

Example:
    >>> ADAPTER_VARIANTS.get("lora").merges, ADAPTER_VARIANTS.get("dora").merges
    (True, False)
    >>> hf_target_modules(("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"))
    ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj')
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stages.registry import Registry

#: a critic's value-head module names (PEFT trains them whole for token classification)
VALUE_HEADS = ("score", "classifier")
#: the adapter name PEFT gives the one adapter a role trains
ADAPTER_NAME = "default"
#: PEFT's adapter directory files (``save_pretrained`` / ``from_pretrained``)
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class AdapterVariantSpec:
    """One :data:`ADAPTER_VARIANTS` entry (``lora.type``).

    Attributes:
        peft_options: extra ``peft.LoraConfig`` keywords of the variant (DoRA: ``use_dora``).
        reference_is_base: switching the adapters off gives the base model back, so the
            reference policy is the actor's module with its adapters off (no reference engine).
        merges: the merged weight of an adapted layer is W + scaling · B·A, which
            :func:`merged_named_weights` computes for the vLLM weight sync; False: the variant
            runs with the HF rollout only.
        why_no_merge: the reason, for the message refusing a vLLM rollout.
    """

    peft_options: Mapping[str, Any]
    reference_is_base: bool
    merges: bool
    why_no_merge: str = ""


ADAPTER_VARIANTS: Registry[AdapterVariantSpec] = Registry("LoRA variant")
ADAPTER_VARIANTS.add(
    "lora", AdapterVariantSpec(peft_options={}, reference_is_base=True, merges=True)
)
ADAPTER_VARIANTS.add(
    "dora",
    AdapterVariantSpec(
        peft_options={"use_dora": True},
        reference_is_base=True,
        merges=False,
        why_no_merge="a DoRA layer's merged weight rescales each row by its magnitude vector, which "
        "the vLLM weight sync does not compute",
    ),
)

#: verl's ``lora.type`` names ppoflow recognises and refuses, with the reason
NOT_IMPLEMENTED_VARIANTS = {
    "vlm_lora": "Megatron's adapters for vision-language models (ppoflow trains text models)",
    "canonical_lora": "Megatron's split-QKV adapters; on Hugging Face models q_proj, k_proj and "
    "v_proj are separate modules already: use type 'lora' with those target_modules",
}

#: Megatron's module names (the ``lora:`` block's defaults) → the Hugging Face modules they are
#: (Llama / Qwen / Mistral layouts); other names pass through unchanged
MEGATRON_MODULES = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}

#: how ``lora_A`` starts (``lora.lora_A_init_method``); ``lora_B`` starts at zero, so an adapter
#: starts as the identity: kaiming is PEFT's default (the flat keys), xavier Megatron's (the block)
A_INITS: dict[str, Callable[[Any], Any]] = {
    "kaiming": lambda weight: __import__("torch").nn.init.kaiming_uniform_(weight, a=math.sqrt(5)),
    "xavier": lambda weight: __import__("torch").nn.init.xavier_uniform_(weight),
}


@dataclass(frozen=True)
class AdapterSettings:
    """One role's adapter, read from either spelling of verl's keys (:func:`adapter_settings`).

    variant: an :data:`ADAPTER_VARIANTS` name. rank: r (0 with ``adapter_path``: the adapter's
    own). alpha: α, the update is scaled by α / r. dropout: on the adapter's input.
    target_modules: module names or PEFT's ``"all-linear"``. exclude_modules: names left out.
    adapter_path: a PEFT adapter directory to start from (trained further). init_a: an
    :data:`A_INITS` name. keys: the config keys they were read from (for messages).
    """

    variant: str
    rank: int
    alpha: float
    dropout: float
    target_modules: str | tuple[str, ...]
    exclude_modules: str | tuple[str, ...] | None
    adapter_path: str | None
    init_a: str
    keys: str

    @property
    def spec(self) -> AdapterVariantSpec:
        return ADAPTER_VARIANTS.get(self.variant)

    def record(self) -> dict[str, Any]:
        """What a checkpoint and the weights lineage record of the adapter (JSON-ready)."""
        out = asdict(self)
        out.pop("keys")
        return json.loads(json.dumps(out))


def hf_target_modules(names: tuple[str, ...]) -> tuple[str, ...]:
    """Megatron's module names of the ``lora:`` block as Hugging Face module names
    (:data:`MEGATRON_MODULES`); other names unchanged, order kept, duplicates dropped."""
    out: list[str] = []
    for name in names:
        for hf_name in MEGATRON_MODULES.get(name, (name,)):
            if hf_name not in out:
                out.append(hf_name)
    return tuple(out)


def _modules(value: str | list[str] | tuple[str, ...] | None) -> str | tuple[str, ...] | None:
    """A target/exclude value as PEFT takes it: a string stays (a name or ``all-linear``), a list
    becomes a tuple; a comma-separated string (a command-line value) becomes a tuple."""
    if value is None or isinstance(value, tuple):
        return value
    if isinstance(value, str):
        parts = tuple(p.strip() for p in value.split(",") if p.strip())
        return value if len(parts) == 1 else parts
    return tuple(value)


def adapter_settings(model: Any, prefix: str) -> AdapterSettings | None:
    """The adapter of a role whose model config is ``model`` (at config key ``prefix``), or
    None when LoRA is off. The flat keys win when they turn it on, else the ``lora:`` block; the
    config checks refuse both at once (``stages.config.checks_lora``). ``lora.type`` and
    ``lora.dropout`` apply to either spelling (the flat keys have none of their own)."""
    lora = model.lora
    if model.lora_rank > 0 or model.lora_adapter_path:
        return AdapterSettings(
            variant=lora.type,
            rank=model.lora_rank,
            alpha=float(model.lora_alpha),
            dropout=float(lora.dropout),
            target_modules=_modules(model.target_modules),
            exclude_modules=_modules(model.exclude_modules),
            adapter_path=model.lora_adapter_path,
            init_a="kaiming",
            keys=f"{prefix}.lora_rank",
        )
    if lora.rank > 0 or lora.adapter_path:
        return AdapterSettings(
            variant=lora.type,
            rank=lora.rank,
            alpha=float(lora.alpha),
            dropout=float(lora.dropout),
            target_modules=hf_target_modules(tuple(lora.target_modules)),
            exclude_modules=tuple(lora.exclude_modules) or None,
            adapter_path=lora.adapter_path,
            init_a=lora.lora_A_init_method,
            keys=f"{prefix}.lora.rank",
        )
    return None


# --- building ----------------------------------------------------------------------------------


def lora_config(settings: AdapterSettings, task_type: str) -> Any:
    """The ``peft.LoraConfig`` of ``settings`` (no adapter_path: a fresh adapter); a critic's
    (``TOKEN_CLS``) leaves its value head out of the targets: it is trained whole."""
    from peft import LoraConfig

    exclude = settings.exclude_modules
    if task_type == "TOKEN_CLS":  # the value head trains whole (modules_to_save), no adapter on it
        exclude = (
            f"(?:{exclude})|(?:.*\\.)?(?:{'|'.join(VALUE_HEADS)})"
            if isinstance(exclude, str)
            else (*(exclude or ()), *VALUE_HEADS)
        )
    return LoraConfig(
        task_type=task_type,
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        exclude_modules=exclude,
        bias="none",
        **settings.spec.peft_options,
    )


def with_adapters(model: Any, settings: AdapterSettings | None, task_type: str) -> Any:
    """``model`` with ``settings``' trainable adapters (a PEFT model, base frozen), or ``model``
    itself for None. ``task_type``: PEFT's ``CAUSAL_LM`` (actor) or ``TOKEN_CLS`` (critic: the
    value head is trained beside the adapters).

    With ``adapter_path`` the adapter is read from that PEFT directory (``is_trainable``), its
    rank and targets its own (:func:`check_adapter_dir` ran before any model loaded); otherwise a
    fresh one: ``lora_B`` zero (the adapted model starts as the base), ``lora_A`` by ``init_a``.

    Raises:
        ValueError: ``target_modules`` (less ``exclude_modules``) match no module of the model.
    """
    if settings is None:
        return model
    from peft import PeftModel, get_peft_model

    if settings.adapter_path:
        return PeftModel.from_pretrained(model, settings.adapter_path, is_trainable=True)
    try:
        wrapped = get_peft_model(model, lora_config(settings, task_type))
    except ValueError as err:
        raise ValueError(no_target_message(settings, err)) from None
    if settings.init_a != "kaiming":  # PEFT's own init is kaiming
        import torch

        with torch.no_grad():
            for name, param in wrapped.named_parameters():
                if ".lora_A." in name:
                    A_INITS[settings.init_a](param)
    return wrapped


def no_target_message(settings: AdapterSettings, err: Exception) -> str:
    key = settings.keys.rsplit(".", 1)[0]
    targets = "target_modules" if settings.keys.endswith("lora_rank") else "lora.target_modules"
    return (
        f"{key}.{targets} = {settings.target_modules!r} (exclude_modules = "
        f"{settings.exclude_modules!r}) match no module the LoRA adapters can wrap in this model: "
        f"{' '.join(str(err).split())[:300]}; name linear modules of the model (e.g. q_proj, "
        "v_proj) or 'all-linear'"
    )


def check_targets_on_meta(settings: AdapterSettings, config: Any, task_type: str) -> None:
    """Fail on targets that match nothing before any weight is read: the adapters are put on a
    model built from its ``config`` on the meta device (no memory, no init)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    if settings.adapter_path:
        return  # the adapter's own targets: PEFT checks them against the loaded model
    build = AutoModelForCausalLM if task_type == "CAUSAL_LM" else AutoModelForTokenClassification
    with torch.device("meta"):
        model = build.from_config(config)
        with_adapters(model, settings, task_type)


def has_adapters(model: Any) -> bool:
    """Whether ``model`` is a PEFT model (adapters on it)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


@contextmanager
def adapters_off(model: Any) -> Iterator[None]:
    """Within the block ``model`` computes as its base (PEFT's ``disable_adapter``): the
    reference policy of a LoRA actor. A model without adapters is an error (its own weights are
    not the reference)."""
    if not has_adapters(model):
        raise TypeError(
            "adapters_off needs a model with LoRA adapters; this actor trains its full weights, "
            "so its reference policy is a model of its own (the ref engine)"
        )
    with model.disable_adapter():
        yield


# --- the merged weights (vLLM sync) ------------------------------------------------------------


def merged_named_weights(
    model: Any, gather: Callable[[list[Any]], AbstractContextManager[Any]] | None = None
) -> Iterator[tuple[str, Any]]:
    """(Hugging Face name, tensor) of the base model with every adapted weight merged,
    W + scaling · B·A, lazily; names as in the base model's own directory (what vLLM loads).

    Nothing is mutated: each merged weight is a new tensor; the others are the parameters
    themselves (detached). ``gather(params)``: a context in which the given parameters are whole
    (ZeRO-3's ``GatheredParameters``; every rank must read the stream to its end); each adapted
    layer's base weight and adapter are gathered together, and yielded tensors are copies then.
    """
    import torch
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    copy = gather is not None  # a gathered parameter is released after its block
    gather = gather or (lambda params: nullcontext())
    for name, param in base.named_parameters():
        if ".lora_" in name:
            continue
        owner, sep, leaf = name.partition(".base_layer.")
        if not sep:
            with gather([param]):
                yield name, param.detach().clone() if copy else param.detach()
            continue
        layer = layers[owner]
        with gather(list(layer.parameters())), torch.no_grad():
            if leaf == "weight":
                delta = layer.get_delta_weight(ADAPTER_NAME)
                yield f"{owner}.weight", param.detach() + delta.to(param.dtype)
            else:
                yield f"{owner}.{leaf}", param.detach().clone() if copy else param.detach()


# --- the base model and an adapter directory -----------------------------------------------------


def weights_fingerprint(path: str | Path) -> str:
    """``blake3:`` over a model directory's ``config.json`` and weight files (name and BLAKE3 of
    each, sorted): the base an adapter belongs to; ``name:<path>`` for a path that is not a
    local directory (a hub id)."""
    import blake3

    root = Path(str(path)).expanduser()
    if not root.is_dir():
        return f"name:{path}"
    hasher = blake3.blake3()
    patterns = ("config.json", "*.safetensors", "*.bin")
    files = sorted({p for pattern in patterns for p in root.glob(pattern) if p.is_file()})
    for file in files:
        digest = blake3.blake3(max_threads=blake3.blake3.AUTO)
        if file.stat().st_size:
            digest.update_mmap(str(file))
        hasher.update(f"{file.name}\0{digest.hexdigest()}\n".encode())
    return "blake3:" + hasher.hexdigest()


def read_adapter_config(path: str | Path, key: str) -> dict[str, Any]:
    """The ``adapter_config.json`` of a PEFT adapter directory; one-line errors naming ``key``."""
    directory = Path(str(path)).expanduser()
    config_file = directory / ADAPTER_CONFIG
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{key} = {str(path)!r}: no {ADAPTER_CONFIG} there; point it at a PEFT adapter "
            "directory (what PeftModel.save_pretrained writes)"
        )
    try:
        return json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{key}: {config_file} is not valid JSON ({err})") from None


def check_adapter_dir(settings: AdapterSettings, model_path: str) -> None:
    """An adapter directory fits the run: a LoRA adapter, its rank the configured one (when one
    is set), trained on ``model_path``'s base: the same files (a local base directory is
    compared by :func:`weights_fingerprint`), else the same name."""
    key = settings.keys.replace("lora_rank", "lora_adapter_path").replace(
        "lora.rank", "lora.adapter_path"
    )
    config = read_adapter_config(settings.adapter_path, key)
    if config.get("peft_type") != "LORA":
        raise ValueError(
            f"{key} = {settings.adapter_path!r} holds a {config.get('peft_type')!r} adapter; "
            "ppoflow trains LoRA adapters (peft_type LORA)"
        )
    if settings.rank and config.get("r") != settings.rank:
        raise ValueError(
            f"{key} = {settings.adapter_path!r} has rank {config.get('r')}, but "
            f"{settings.keys} = {settings.rank}; set it to 0 (the adapter's own) or {config.get('r')}"
        )
    base = config.get("base_model_name_or_path")
    if not base or same_base(str(base), model_path):
        return
    raise ValueError(
        f"{key} = {settings.adapter_path!r} was trained on base model {base!r}, but "
        f"actor_rollout_ref.model.path = {model_path!r} is another model; point model.path at "
        f"that base (or correct base_model_name_or_path in its {ADAPTER_CONFIG})"
    )


def same_base(base: str, model_path: str) -> bool:
    """Whether an adapter's ``base_model_name_or_path`` is ``model_path``: the same files when
    both are local directories (:func:`weights_fingerprint`), else the same name."""
    base_dir, model_dir = Path(base).expanduser(), Path(model_path).expanduser()
    if base_dir.is_dir() and model_dir.is_dir():
        return weights_fingerprint(base_dir) == weights_fingerprint(model_dir)
    return base.rstrip("/") == model_path.rstrip("/")


def lineage_text(settings: AdapterSettings | None, adapter_digest: str | None) -> str:
    """What the weights lineage adds for an adapter: its settings and the content digest of the
    adapter directory it starts from ('' without adapters)."""
    if settings is None:
        return ""
    text = json.dumps({**settings.record(), "adapter_digest": adapter_digest}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
