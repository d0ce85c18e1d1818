"""Chat templates and tokenizers for the agent tests (no download).

``QWEN25_CHAT_TEMPLATE`` is the chat template of Qwen2.5's instruct models
(``tokenizer_config.json`` of e.g. Qwen/Qwen2.5-7B-Instruct), verbatim: tools in a
``<tools></tools>`` block of the system message, assistant tool calls as
``<tool_call>{json}</tool_call>``, and consecutive tool messages inside one
``<|im_start|>user\\n<tool_response>\\n…\\n</tool_response>`` block.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken

from stages.data.tokenizer import build_tiny_tokenizer

QWEN25_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

#: a template that is not append-only: a conversation rendered without the generation prompt
#: ends with ``[END]``, which the render with more messages does not have there
NOT_APPEND_ONLY_TEMPLATE = (
    "{%- for message in messages -%}<|{{ message['role'] }}|>{{ message['content'] }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- else -%}[END]{%- endif -%}"
)


def build_qwen25_style_tokenizer() -> Any:
    """The tiny byte-level tokenizer with ``<|im_start|>``/``<|im_end|>`` added as special
    tokens, EOS ``<|im_end|>`` and Qwen2.5's chat template."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")],
        special_tokens=True,
    )
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    return tokenizer
