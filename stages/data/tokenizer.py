"""The tiny byte-level tokenizer of the CPU demo and tests, and a loader for any tokenizer.

`build_tiny_tokenizer` makes, with no download, a byte-level tokenizer wrapped as a transformers
fast tokenizer: ids 0–4 are the special tokens of `SPECIAL_TOKENS`, id ``BYTE_OFFSET + b`` is
byte ``b`` (so every UTF-8 text round-trips and each ASCII character is one token); 261 ids in
all. Its chat template marks each turn with a role token and ends assistant turns with EOS:

    <|user|>copy: c<|assistant|>        (add_generation_prompt=True)

It is saved with ``save_pretrained`` and reloads with ``AutoTokenizer.from_pretrained(dir)``
offline, like any Hugging Face tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, *ROLE_TOKENS)
BYTE_OFFSET = len(SPECIAL_TOKENS)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}"
    "{%- if message['role'] == 'assistant' -%}" + EOS_TOKEN + "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def byte_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet: each byte ↦ one printable unicode character.

    Printable Latin-1 bytes map to themselves; the others to code points 256, 257, … in order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def build_tiny_tokenizer() -> Any:
    """A byte-level `PreTrainedTokenizerFast` (261 ids) with pad/eos tokens and a chat template."""
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for byte, char in byte_to_unicode().items():
        vocab[char] = BYTE_OFFSET + byte
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS),
        padding_side="left",
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def load_tokenizer(path: str | Path, **kwargs: Any) -> Any:
    """``AutoTokenizer.from_pretrained(path)`` for a local directory or a hub id (needs network).

    A tokenizer without a pad token gets its EOS token as pad (the usual choice for causal LMs);
    one with neither is an error, since prompts are left-padded.
    """
    from transformers import AutoTokenizer

    from stages.engines.models import check_model_path

    check_model_path(path, needs=("tokenizer_config.json", "tokenizer.json"))
    tokenizer = AutoTokenizer.from_pretrained(str(path), **kwargs)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(
                f"tokenizer at {str(path)!r} has neither a pad nor an eos token; "
                "set pad_token in its tokenizer_config.json"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
