"""HF rollouts decoded by ppoflow's own loop: a static KV cache, finished rows dropped from the
batch, and on CUDA each step's forward compiled into CUDA graphs; and the table of HF decode paths.

``generate`` (``rollout_hf``'s path) keeps every row in the batch until the last one ends, and
its cache changes shape every token, so its decode step cannot be captured once and replayed.
:func:`static_decode` runs the same decoding over the model's forward:

1. **prefill**: each distinct prompt once (a prompt's n samples share it), all its columns but
   the leading ones that are padding in every row; the states are copied to one row per sample
   of :class:`~stages.engines.kv_cache.SlotBuffers` with C = P + R columns (fixed per prompt
   width, so a compiled step sees the same shapes call after call).
2. **one token per step** for the rows in the batch: HF's own logits processors for the call's
   ``GenerationConfig`` (the list ``generate`` builds: temperature, top-k, top-p, and whatever
   the model's ``generation_config`` adds), then argmax or one ``torch.multinomial`` draw;
   ``log softmax(scores / temperature)`` of the chosen token is taken where ``rollout_hf``'s
   recorder takes it (:class:`LogProbTap`, before the sampling warpers).
3. **finished rows leave in buckets**: the batch sizes are B and the powers of two below it down
   to ``min_rows``; once at most s rows are live (s the smallest such size that holds them), the
   live rows' cache rows move to the front and the batch shrinks to s, the free places filled
   with copies of a live row whose tokens are discarded. Between shrinks a finished row stays in
   the batch and is fed pad, as in ``generate``. Halving bounds the copies to about one cache.
4. **compiled** (a :class:`CompileSettings`): each step's forward runs ``torch.compile``d; with
   ``mode="reduce-overhead"`` that is one CUDA graph per batch size. The buffers then persist
   per module between calls (as ``generate`` keeps its static cache on the model), so the graphs
   are replayed, not recorded again; :func:`release_decode_buffers` frees them.

Greedy decoding gives ``generate``'s tokens, and the log-probs equal its log-probs up to float
rounding (a static cache of C columns against ``generate``'s growing one). Sampling keeps
``rollout_hf``'s contract, one torch generator per call seeded with ``SamplingSettings.seed``,
but not ``generate``'s draws: a smaller batch changes what each multinomial call draws.

Decode paths, ``HF_DECODE_PATHS``: ``rollout_hf.choose_decode_path`` takes the entry of highest
``preference`` whose needs hold (``generate`` is registered in ``rollout_hf``):

===============  =====================================  ==========  ========  ========  ===========
name             runs                                   preference  chosen    compiles  needs plain
                                                                    on                  attention
===============  =====================================  ==========  ========  ========  ===========
``cuda_graphs``  :func:`static_decode` compiled         2           cuda      yes       yes
                 (reduce-overhead), batches ≥ 8 rows
``static``       :func:`static_decode` eager,           1           cuda      no        yes
                 batches ≥ 1 row
``generate``     HF ``generate`` (``rollout_hf``)       0           any       no        no
===============  =====================================  ==========  ========  ========  ===========
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.masking_utils import create_masks_for_generate

from stages.engines.kv_cache import SlotBuffers, has_plain_attention_layers, slot_shapes
from stages.engines.trimming import first_used_column
from stages.registry import Registry

if TYPE_CHECKING:
    from stages.engines.rollout_hf import SamplingSettings

#: decode(module, input_ids (B, P), attention_mask (B, P), settings, **generate_kwargs)
#: -> (responses (B, R) right-padded with pad, log_probs (B, R) float32, 0 at padding)
DecodeFn = Callable[..., tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class DecodePathSpec:
    """One ``HF_DECODE_PATHS`` entry.

    Attributes:
        run: see :data:`DecodeFn`.
        preference: among the entries whose needs hold, the highest is chosen.
        device_types: the device types it is chosen on (``torch.device.type``); None: any.
        compiles: it runs ``torch.compile`` / CUDA graphs, so it is not chosen with
            ``rollout.enforce_eager`` (verl's "no CUDA graphs") nor when the weights are
            gathered for each call (ZeRO-3: new addresses every rollout, and DeepSpeed's hooks).
        needs_plain_attention: the model's cache must be full-attention layers only
            (``kv_cache.has_plain_attention_layers``: no sliding window or linear attention).
    """

    run: DecodeFn
    preference: int
    device_types: frozenset[str] | None
    compiles: bool
    needs_plain_attention: bool

    def fits(
        self,
        module: nn.Module,
        device: torch.device,
        *,
        enforce_eager: bool,
        weights_gathered: bool,
    ) -> bool:
        """Whether its needs hold for ``module`` generating on ``device``."""
        return (
            (self.device_types is None or device.type in self.device_types)
            and not (self.compiles and (enforce_eager or weights_gathered))
            and (not self.needs_plain_attention or has_plain_attention_layers(module))
        )


HF_DECODE_PATHS: Registry[DecodePathSpec] = Registry("HF decode path")


@dataclass(frozen=True)
class CompileSettings:
    """``torch.compile`` arguments of the decode step's forward.

    mode: torch.compile's mode ("reduce-overhead": CUDA graphs); None for backends without modes.
    backend: torch.compile's backend ("inductor"; "aot_eager" traces without generating code).
    fullgraph: a graph break is an error instead of a split graph.
    recompile_limit: torch._dynamo's recompile limit while decoding: one graph per batch size and
        prompt width (the default 8 would fall back to eager after a few bucket sizes).
    """

    mode: str | None
    backend: str
    fullgraph: bool
    recompile_limit: int


class LogProbTap(LogitsProcessor):
    """Keeps (B, V) log softmax(scores / temperature) of the scores it is handed, unchanged.

    Placed in the processor list where ``rollout_hf.ChosenTokenLogProbs`` sits in ``generate``'s
    (custom processors run before the sampling warpers), so both see the same scores.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.log_probs: Tensor | None = None

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        self.log_probs = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores


def hf_logits_processors(
    module: nn.Module, settings: SamplingSettings, input_ids: Tensor, tap: LogProbTap
) -> LogitsProcessorList:
    """The processors ``generate`` applies for ``settings`` to prompts ``input_ids`` (B, P'),
    with ``tap`` where a custom processor goes (transformers' own builders, so the model's
    ``generation_config`` adds what it adds there)."""
    config, _ = module._prepare_generation_config(settings.generation_config())
    module._prepare_special_tokens(
        config, True, device=input_ids.device, batch_size=input_ids.shape[0]
    )
    return module._get_logits_processor(
        generation_config=config,
        input_ids_seq_length=input_ids.shape[1],
        encoder_input_ids=input_ids,
        logits_processor=LogitsProcessorList([tap]),
        device=input_ids.device,
        model_kwargs={},
    )


def bucket_sizes(rows: int, min_rows: int) -> list[int]:
    """The batch sizes a decode of ``rows`` rows runs at: ``rows``, then the powers of two below
    it down to ``min_rows`` (largest first).

    >>> bucket_sizes(64, 8), bucket_sizes(48, 8), bucket_sizes(5, 8), bucket_sizes(6, 1)
    ([64, 32, 16, 8], [48, 32, 16, 8], [5], [6, 4, 2, 1])
    """
    sizes, size = [rows], 1
    while size * 2 < rows:
        size *= 2  # the largest power of two below rows
    while size >= max(min_rows, 1) and size < rows:
        sizes.append(size)
        size //= 2
    return sizes


@dataclass
class DecodeBatch:
    """The rows being decoded, in batch order (slot s holds row ``rows[s]``, -1 for a filler).

    Shapes: b = the batch size now, P the prompt width, C = P + R the cache columns.
    """

    rows: Tensor  # (b,) int64 the row of the call each slot decodes, -1 for a filler
    is_live: Tensor  # (b,) bool not finished (no stop id yet) and not a filler
    positions: Tensor  # (b,) int64 the position id of the next token fed
    mask: Tensor  # (b, C) int64 prompt mask ‖ ones: the 2-D mask of every step
    sequences: Tensor  # (b, P + R) prompt ‖ tokens chosen so far (pad after a row finished)
    log_probs: Tensor  # (b, R) float32 log-probs of the chosen tokens, 0 after a row finished
    prompt_width: int
    stop_ids: Tensor  # (k,) the ids that end a row (none with ignore_eos)

    @classmethod
    def start(
        cls, input_ids: Tensor, attention_mask: Tensor, settings: SamplingSettings
    ) -> DecodeBatch:
        rows, width = input_ids.shape
        response = settings.response_length
        return cls(
            rows=torch.arange(rows, device=input_ids.device),
            is_live=torch.ones(rows, dtype=torch.bool, device=input_ids.device),
            positions=attention_mask.long().sum(-1),  # (B,) the first response token's position
            mask=torch.nn.functional.pad(attention_mask.long(), (0, response), value=1),
            sequences=torch.nn.functional.pad(
                input_ids, (0, response), value=settings.pad_token_id
            ),
            log_probs=input_ids.new_zeros(rows, response, dtype=torch.float32),
            prompt_width=width,
            stop_ids=torch.tensor(settings.stop_ids, dtype=torch.long, device=input_ids.device),
        )

    _per_slot = ("rows", "is_live", "positions", "mask", "sequences", "log_probs")

    @property
    def size(self) -> int:
        return self.rows.shape[0]

    def select(self, keep: Tensor, real: int) -> DecodeBatch:
        """Slots ``keep`` (b',): the first ``real`` are rows, the rest fillers."""
        picked = {name: getattr(self, name).index_select(0, keep) for name in self._per_slot}
        picked["rows"][real:] = -1
        picked["is_live"][real:] = False
        return DecodeBatch(**picked, prompt_width=self.prompt_width, stop_ids=self.stop_ids)

    def write_out(self, responses: Tensor, log_probs: Tensor) -> None:
        """Copy the responses (B, R) and log-probs (B, R) of the slots that hold rows."""
        real = self.rows >= 0
        responses[self.rows[real]] = self.sequences[real, self.prompt_width :]
        log_probs[self.rows[real]] = self.log_probs[real]


def choose_tokens(
    batch: DecodeBatch,
    step: int,
    logits: Tensor,
    processors: LogitsProcessorList,
    tap: LogProbTap,
    first_column: int,
    settings: SamplingSettings,
) -> Tensor:
    """Token ``step`` of every slot from its (b, V) float32 logits, as ``generate`` picks it;
    written to ``batch``, which marks rows that chose a stop id finished. Returns the (b,) tokens
    (pad for finished rows)."""
    column = batch.prompt_width + step
    scores = processors(batch.sequences[:, first_column:column], logits)  # (b, V)
    if settings.do_sample:
        tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
    else:
        tokens = torch.argmax(scores, dim=-1)
    token_log_probs = tap.log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (b,)
    tokens = tokens.masked_fill(~batch.is_live, settings.pad_token_id)
    batch.sequences[:, column] = tokens
    batch.log_probs[:, step] = token_log_probs.masked_fill(~batch.is_live, 0.0)
    batch.is_live &= ~torch.isin(tokens, batch.stop_ids)
    return tokens


def _model_step(
    module: nn.Module, input_ids: Tensor, position_ids: Tensor, mask: Any, cache: Any
) -> Tensor:
    """(b, 1, V) logits of one token per row (the function that is compiled)."""
    return module(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=mask,
        past_key_values=cache,
        use_cache=True,
    ).logits


@functools.cache
def _compiled_step(settings: CompileSettings) -> Callable[..., Tensor]:
    return torch.compile(
        _model_step,
        mode=settings.mode,
        backend=settings.backend,
        fullgraph=settings.fullgraph,
        dynamic=False,
    )


def decode_step(
    module: nn.Module,
    batch: DecodeBatch,
    tokens: Tensor,
    cache: Any,
    compiled: CompileSettings | None,
) -> Tensor:
    """Feed ``tokens`` (b,) at ``batch.positions``; (b, V) float32 logits of the next token.

    The 4-D mask is made outside the compiled forward, as ``generate`` does for a static cache.
    """
    make_mask = getattr(module, "create_masks_for_generate", create_masks_for_generate)
    mask = make_mask(
        config=module.config,
        inputs_embeds=torch.empty((batch.size, 1, 0), dtype=module.dtype, device=tokens.device),
        attention_mask=batch.mask,
        past_key_values=cache,
        position_ids=batch.positions.unsqueeze(1),
    )
    step = _model_step
    if compiled is not None:
        step = _compiled_step(compiled)
        if compiled.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are dead
    logits = step(module, tokens.unsqueeze(1), batch.positions.unsqueeze(1), mask, cache)
    batch.positions += 1
    return logits[:, -1].to(torch.float32, copy=True)  # a copy: the next replay overwrites


#: the buffers of the compiled path, kept per module between calls (see the module docstring)
_POOLED_BUFFERS: weakref.WeakKeyDictionary[nn.Module, SlotBuffers] = weakref.WeakKeyDictionary()


def release_decode_buffers(module: nn.Module) -> None:
    """Free the key / value buffers the compiled path keeps for ``module`` (none: no-op)."""
    _POOLED_BUFFERS.pop(module, None)


def prefill(
    module: nn.Module, input_ids: Tensor, attention_mask: Tensor, capacity: int, pooled: bool
) -> tuple[Tensor, SlotBuffers]:
    """Each distinct prompt's forward once; (B, V) float32 logits of each row's first token and
    the buffers holding each row's prompt states at columns P - P' … P - 1 (P' = the columns
    after the leading all-padding ones, which are the only ones run)."""
    rows = input_ids.shape[0]
    start = first_used_column(attention_mask)
    keys = torch.cat([input_ids[:, start:], attention_mask[:, start:].to(input_ids.dtype)], dim=1)
    distinct, row_of = torch.unique(keys, dim=0, return_inverse=True)  # (U, 2P'), (B,)
    ids, mask = distinct.chunk(2, dim=1)
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate makes them
    out = module(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    shapes = slot_shapes(out.past_key_values)
    if shapes is None:
        raise ValueError(
            f"static_decode needs a cache of full-attention layers only, got "
            f"{[type(layer).__name__ for layer in out.past_key_values.layers]}; "
            "decode this model with the 'generate' path"
        )
    dtype = out.past_key_values.layers[0].keys.dtype
    buffers = _POOLED_BUFFERS.get(module) if pooled else None
    if buffers is None or not buffers.fits(shapes, rows, capacity, dtype):
        buffers = SlotBuffers(shapes, rows, capacity, dtype, input_ids.device)
        if pooled:
            _POOLED_BUFFERS[module] = buffers
    buffers.fill(out.past_key_values, row_of, offset=start)
    return out.logits[:, -1].to(torch.float32, copy=True).index_select(0, row_of), buffers


@contextlib.contextmanager
def _recompile_limit(compiled: CompileSettings | None) -> Iterator[None]:
    if compiled is None:
        yield
        return
    with torch._dynamo.config.patch(recompile_limit=compiled.recompile_limit):
        yield


def static_decode(
    module: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    settings: SamplingSettings,
    *,
    compiled: CompileSettings | None,
    min_rows: int,
    **generate_kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """(B, R) responses right-padded with pad and their (B, R) float32 log-probs for left-padded
    prompts ``input_ids`` / ``attention_mask`` (B, P); see the module docstring."""
    if generate_kwargs:
        raise TypeError(
            f"static_decode takes no generate() arguments, got {sorted(generate_kwargs)}"
        )
    rows, width = input_ids.shape
    response = settings.response_length
    tap = LogProbTap(settings.temperature if settings.do_sample else 1.0)
    first_column = first_used_column(attention_mask)
    processors = hf_logits_processors(module, settings, input_ids[:, first_column:], tap)
    logits, buffers = prefill(
        module, input_ids, attention_mask, width + response, compiled is not None
    )
    batch = DecodeBatch.start(input_ids, attention_mask, settings)
    sizes = bucket_sizes(rows, min_rows)
    responses = input_ids.new_full((rows, response), settings.pad_token_id)
    log_probs = input_ids.new_zeros(rows, response, dtype=torch.float32)
    with _recompile_limit(compiled):
        for step in range(response):
            tokens = choose_tokens(batch, step, logits, processors, tap, first_column, settings)
            live = int(batch.is_live.sum())  # one host sync per token, as generate's stop check
            if live == 0 or step == response - 1:
                break
            size = min(s for s in sizes if s >= live)
            if size < batch.size:  # shrink: the finished rows' outputs are final
                batch.write_out(responses, log_probs)
                keep = batch.is_live.nonzero().squeeze(1)  # (live,)
                keep = torch.cat([keep, keep[:1].expand(size - live)])  # (size,) fillers last
                batch, tokens = batch.select(keep, live), tokens.index_select(0, keep)
                buffers.compact(keep)
            logits = decode_step(module, batch, tokens, buffers.cache(batch.size), compiled)
    batch.write_out(responses, log_probs)
    return responses, log_probs


HF_DECODE_PATHS.add(
    "cuda_graphs",
    DecodePathSpec(
        run=functools.partial(
            static_decode,
            compiled=CompileSettings(
                mode="reduce-overhead", backend="inductor", fullgraph=False, recompile_limit=64
            ),
            min_rows=8,
        ),
        preference=2,
        device_types=frozenset({"cuda"}),
        compiles=True,
        needs_plain_attention=True,
    ),
)
HF_DECODE_PATHS.add(
    "static",
    DecodePathSpec(
        run=functools.partial(static_decode, compiled=None, min_rows=1),
        preference=1,
        device_types=frozenset({"cuda"}),
        compiles=False,
        needs_plain_attention=True,
    ),
)
