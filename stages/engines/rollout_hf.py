"""Rollouts with Hugging Face ``generate`` on the actor's own module (no second weight copy).

``generate_sequences`` decodes with the function it is given: by default ``generate`` (here), or
an ``HF_DECODE_PATHS`` entry's (``stages.engines.hf_decode``: a static cache, finished rows
dropped, CUDA graphs), which :func:`choose_decode_path` picks by what each entry needs.

Input: a prompt batch already repeated ``n`` times (interleaved, so the samples of one prompt are
adjacent), left-padded ``input_ids`` / ``attention_mask`` / ``position_ids`` of width P.
Output (B rows, one response each):

    prompts           (B, P) the input ids, left-padded
    responses         (B, R) right-padded with pad_token_id, R = response_length exactly
    input_ids         (B, P + R) prompts ‖ responses
    attention_mask    (B, P + R) prompt mask ‖ response_mask
    position_ids      (B, P + R) prompt positions, then last prompt position + 1, + 2, …
    response_mask     (B, R) 1 on generated tokens up to and including the first EOS (with
                      ``ignore_eos``: on all R tokens, an EOS among them is an ordinary token)
    rollout_log_probs (B, R) log softmax(logits / temperature) at the chosen token (0 at padding)

``rollout_log_probs`` are taken from the raw logits before top-k / top-p truncation, i.e. the
distribution the actor recomputes for ``old_log_probs`` at the same temperature; with greedy
decoding the temperature is 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict
from torch import Tensor, nn
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from dataproto import DataProto
from stages.engines.hf_decode import HF_DECODE_PATHS, DecodeFn, DecodePathSpec
from stages.engines.kv_cache import reserved_cache
from stages.engines.trimming import first_used_column


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling parameters of one rollout call (verl's rollout.* / val_kwargs.* names).

    response_length: R, the maximum number of generated tokens (and the output width).
    temperature / top_p / top_k: top_k ≤ 0 means no top-k; ignored when do_sample is False.
    eos_token_id: one id or several; pad_token_id pads responses after EOS.
    ignore_eos: verl's ``rollout.ignore_eos``: generation does not stop at EOS, every response
        has ``response_length`` tokens and its mask covers them all (``stop_ids`` is empty).
    max_batch_rows: rows generated together (bounds the KV cache); 0 = all rows at once.
    seed: when set, sampling is seeded with it (HF: torch's generator, forked so the caller's
        RNG state is untouched; vLLM: row i of the call gets seed + i), so the same call on
        the same weights samples the same responses in any process.
    """

    response_length: int
    eos_token_id: int | tuple[int, ...]
    pad_token_id: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    ignore_eos: bool = False
    max_batch_rows: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.response_length < 1:
            raise ValueError(f"response_length must be ≥ 1, got {self.response_length}")
        if self.do_sample and self.temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 when sampling, got {self.temperature}; use do_sample=False for greedy"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (
            (self.eos_token_id,) if isinstance(self.eos_token_id, int) else tuple(self.eos_token_id)
        )

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The ids that end a response: ``eos_ids``, or none with ``ignore_eos``."""
        return () if self.ignore_eos else self.eos_ids

    def generation_config(self) -> GenerationConfig:
        sampling = dict(temperature=self.temperature, top_p=self.top_p, top_k=max(self.top_k, 0))
        return GenerationConfig(
            max_new_tokens=self.response_length,
            do_sample=self.do_sample,
            eos_token_id=list(self.stop_ids),  # [] (not None): the model's own EOS is not used
            pad_token_id=self.pad_token_id,
            **(sampling if self.do_sample else {}),
        )


class ChosenTokenLogProbs(LogitsProcessor):
    """Records log softmax(raw logits / temperature) of each chosen token while ``generate`` runs.

    Custom processors run before the sampling warpers, so ``scores`` are the raw logits. The token
    chosen at step t is only known at step t + 1 (the last column of ``input_ids``), so one (B, V)
    row is kept between calls and the final step is gathered by :meth:`finish`.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.pending: Tensor | None = None  # (B, V) log-probs of the step whose token is unknown
        self.chosen: list[Tensor] = []  # R' tensors of shape (B,)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        self._gather(input_ids[:, -1])
        self.pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _gather(self, tokens: Tensor) -> None:
        if self.pending is not None:
            self.chosen.append(self.pending.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
            self.pending = None

    def finish(self, generated: Tensor) -> Tensor:
        """(B, R') log-probs of ``generated`` (the new tokens, R' = generated steps)."""
        self._gather(generated[:, -1])
        if not self.chosen:
            return generated.new_zeros(generated.shape, dtype=torch.float32)
        return torch.stack(self.chosen, dim=1)


def response_mask_from_tokens(responses: Tensor, eos_ids: tuple[int, ...]) -> Tensor:
    """(B, R) int64 mask: 1 up to and including the first EOS, 0 after it (all 1 without EOS,
    or when ``eos_ids`` is empty: ``ignore_eos``).

    Example:
        >>> response_mask_from_tokens(torch.tensor([[5, 2, 0], [5, 6, 7]]), (2,))
        tensor([[1, 1, 0],
                [1, 1, 1]])
        >>> response_mask_from_tokens(torch.tensor([[5, 2, 0]]), ())
        tensor([[1, 1, 1]])
    """
    if not eos_ids:
        return torch.ones_like(responses, dtype=torch.long)
    is_eos = torch.isin(responses, torch.tensor(eos_ids, device=responses.device))
    eos_before = is_eos.long().cumsum(dim=1) - is_eos.long()  # EOS strictly before each position
    return (eos_before == 0).long()


def _generate_rows(
    module: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    settings: SamplingSettings,
    **generate_kwargs,
) -> tuple[Tensor, Tensor]:
    """(B, R) right-padded responses and their (B, R) log-probs for one chunk of rows.

    The leading prompt columns that are padding in every row are dropped before ``generate``
    (``stages.engines.trimming``): HF derives position ids from the attention mask, so the real
    tokens see the same positions, and attention never reads padding. Rows with the same prompt
    (a prompt's ``n`` samples) share its KV cache (:func:`shared_prompt_cache`), and the cache
    writes each new token in place where the model allows (``stages.engines.kv_cache``).
    """
    start = first_used_column(attention_mask)
    input_ids, attention_mask = input_ids[:, start:], attention_mask[:, start:]
    recorder = ChosenTokenLogProbs(settings.temperature if settings.do_sample else 1.0)
    cache = reserved_cache(module, settings.response_length)  # None: the model's own
    shared = shared_prompt_cache(module, input_ids, attention_mask, cache)
    if shared is not None:
        cache = shared  # the reserved cache filled, or the model's own holding the prefill
    if cache is not None:
        generate_kwargs = {**generate_kwargs, "past_key_values": cache}
    sequences = module.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        generation_config=settings.generation_config(),
        logits_processor=LogitsProcessorList([recorder]),
        **generate_kwargs,
    )
    generated = sequences[:, input_ids.shape[1] :]  # (B, R') with R' ≤ R
    logprobs = recorder.finish(generated)
    missing = settings.response_length - generated.shape[1]
    responses = torch.nn.functional.pad(generated, (0, missing), value=settings.pad_token_id)
    return responses, torch.nn.functional.pad(logprobs, (0, missing), value=0.0)


def shared_prompt_cache(
    module: nn.Module, input_ids: Tensor, attention_mask: Tensor, cache: Any = None
) -> Any:
    """The KV cache of each row's prompt but its last column, computed once per distinct prompt.

    A rollout repeats every prompt ``n`` times, so ``generate`` would run the same prefill ``n``
    times. Here the distinct (ids, mask) rows of the (B, P) prompts, U of them, go through one
    forward of their first P - 1 columns (position ids from the mask, as ``generate`` makes
    them); the cache is then repeated to the B rows (``Cache.batch_select_indices``) and handed
    to ``generate``, which runs only the last column before it samples (HF's resume from a
    cache: full ``input_ids`` and mask, the cached columns skipped). The same keys and values
    as ``generate``'s own prefill, up to float rounding of a smaller batch. None when no prompt
    repeats or the prompts are one column wide: ``generate`` then does the prefill itself.
    ``cache``: the empty cache to fill (``kv_cache.reserved_cache``); None: the model's own.
    """
    rows, width = input_ids.shape
    if width < 2:
        return None
    keys = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)
    distinct, row_of = torch.unique(keys, dim=0, return_inverse=True)  # (U, 2P), (B,)
    if distinct.shape[0] == rows:
        return None
    ids, mask = distinct[:, : width - 1], distinct[:, width : 2 * width - 1]
    mask = mask.to(attention_mask.dtype)
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = module(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    ).past_key_values
    cache.batch_select_indices(row_of)
    return cache


HF_DECODE_PATHS.add(
    "generate",
    DecodePathSpec(
        run=_generate_rows,
        preference=0,
        device_types=None,
        compiles=False,
        needs_plain_attention=False,
    ),
)


def choose_decode_path(
    module: nn.Module, device: torch.device, *, enforce_eager: bool, weights_gathered: bool
) -> DecodePathSpec:
    """The ``HF_DECODE_PATHS`` entry of highest preference whose needs hold
    (``DecodePathSpec.fits``); ``generate`` fits everywhere.

    ``enforce_eager``: verl's ``rollout.enforce_eager`` (no torch.compile / CUDA graphs);
    ``weights_gathered``: the module's parameters are gathered around each call (ZeRO-3).
    """
    specs = [HF_DECODE_PATHS.get(name) for name in HF_DECODE_PATHS]
    fitting = [
        spec
        for spec in specs
        if spec.fits(module, device, enforce_eager=enforce_eager, weights_gathered=weights_gathered)
    ]
    return max(fitting, key=lambda spec: spec.preference)


@torch.no_grad()
def generate_sequences(
    module: nn.Module,
    prompts: DataProto,
    settings: SamplingSettings,
    decode: DecodeFn = _generate_rows,
    **generate_kwargs,
) -> DataProto:
    """One response per prompt row; see the module docstring for the output layout.

    ``decode``: the decode path's function (``choose_decode_path(...).run``); by default HF
    ``generate``. ``generate_kwargs`` go to it, for ``generate``: ``module.generate`` (e.g.
    ``synced_gpus=True`` under ZeRO-3 with several ranks).
    """
    batch = prompts.batch
    input_ids, prompt_mask = batch["input_ids"], batch["attention_mask"]
    rows = input_ids.shape[0]
    step = settings.max_batch_rows or rows
    was_training = module.training
    module.eval()
    try:
        with seeded_rng(settings.seed, input_ids.device):
            chunks = _generate_chunks(
                module, input_ids, prompt_mask, settings, step, decode, **generate_kwargs
            )
    finally:
        module.train(was_training)
    responses = torch.cat([c[0] for c in chunks])  # (B, R)
    return assemble_rollout(batch, responses, torch.cat([c[1] for c in chunks]), settings)


@contextlib.contextmanager
def seeded_rng(seed: int | None, device: torch.device) -> Iterator[None]:
    """Inside: torch's RNG seeded with ``seed`` (CPU and ``device``); after: the state it had
    before, as if nothing was drawn. ``seed=None``: the RNG as it is, unforked."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _generate_chunks(
    module: nn.Module,
    input_ids: Tensor,
    prompt_mask: Tensor,
    settings: SamplingSettings,
    step: int,
    decode: DecodeFn,
    **generate_kwargs: Any,
) -> list[tuple[Tensor, Tensor]]:
    rows = input_ids.shape[0]
    return [
        decode(
            module,
            input_ids[i : i + step],
            prompt_mask[i : i + step],
            settings,
            **generate_kwargs,
        )
        for i in range(0, rows, step)
    ]


def assemble_rollout(
    prompt_batch: TensorDict, responses: Tensor, log_probs: Tensor, settings: SamplingSettings
) -> DataProto:
    """The rollout fields from prompts (B, P) and right-padded responses / log-probs (B, R).

    Tokens after the first EOS are replaced by pad and their log-probs by 0.
    """
    input_ids, prompt_mask, prompt_pos = (
        prompt_batch["input_ids"],
        prompt_batch["attention_mask"],
        prompt_batch["position_ids"],
    )
    device = input_ids.device
    responses, log_probs = responses.to(device), log_probs.to(device)
    response_mask = response_mask_from_tokens(responses, settings.stop_ids)  # (B, R)
    responses = responses.masked_fill(response_mask == 0, settings.pad_token_id)
    offsets = torch.arange(1, settings.response_length + 1, device=device)
    out = TensorDict(
        {
            "prompts": input_ids,
            "responses": responses,
            "input_ids": torch.cat([input_ids, responses], dim=1),
            "attention_mask": torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1),
            "position_ids": torch.cat([prompt_pos, prompt_pos[:, -1:] + offsets], dim=1),
            "response_mask": response_mask,
            "rollout_log_probs": log_probs * response_mask,
        },
        batch_size=[input_ids.shape[0]],
    )
    return DataProto(batch=out, non_tensor_batch={}, meta_info={})
