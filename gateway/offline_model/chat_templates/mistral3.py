# ruff: noqa: E501, W291  (upstream's template, verbatim: its long lines and its one trailing space)
"""Mistral Small 3.1's chat template (mistralai/Mistral-Small-3.1-24B-Instruct-2503), verbatim.

Without a system message it writes Mistral's default one, which names today's date through
`strftime_now` (so the rendered prompt, and a prefix cache's key, changes at midnight, local
time of the process that renders it); a system message with list content uses its first
part's text. User turns are `[INST]...[/INST]` with `[IMG]` where an image part stands,
assistant turns end with `eos_token`, and it starts with `bos_token`.
"""

TEMPLATE = r"""{%- set today = strftime_now("%Y-%m-%d") %}
{%- set default_system_message = "You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French startup headquartered in Paris.\nYour knowledge base was last updated on 2023-10-01. The current date is " + today + ".\n\nWhen you're not sure about some information, you say that you don't have the information and don't make up anything.\nIf the user's question is not clear, ambiguous, or does not provide enough context for you to accurately answer the question, you do not try to answer it right away and you rather ask the user to clarify their request (e.g. \"What are some good restaurants around me?\" => \"Where are you?\" or \"When is the next flight to Tokyo\" => \"Where do you travel from?\")" %}

{{- bos_token }}

{%- if messages[0]['role'] == 'system' %}
    {%- if messages[0] is string %}
        {%- set system_message = messages[0]['content'] %}
        {%- set loop_messages = messages[1:] %}
    {%- else %} 
        {%- set system_message = messages[0]['content'][0]['text'] %}
        {%- set loop_messages = messages[1:] %}
    {%- endif %}
{%- else %}
    {%- set system_message = default_system_message %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}

{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
            {%- if message['content'] is string %}
            {{- '[INST]' + message['content'] + '[/INST]' }}
            {%- else %}
                    {{- '[INST]' }}
                    {%- for block in message['content'] %}
                            {%- if block['type'] == 'text' %}
                                    {{- block['text'] }}
                            {%- elif block['type'] == 'image' or block['type'] == 'image_url' %}
                                    {{- '[IMG]' }}
                                {%- else %}
                                    {{- raise_exception('Only text and image blocks are supported in message content!') }}
                                {%- endif %}
                        {%- endfor %}
                    {{- '[/INST]' }}
                {%- endif %}
    {%- elif message['role'] == 'system' %}
        {{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}
    {%- elif message['role'] == 'assistant' %}
        {%- if message['content'] is string %}
            {{- message['content'] + eos_token }}
        {%- else %}
            {{- message['content'][0]['text'] + eos_token }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Only user, system and assistant roles are supported!') }}
    {%- endif %}
{%- endfor %}"""
