# ruff: noqa: E501  (the template is upstream's text, verbatim: its lines are as long as they are)
"""SmolVLM's chat template (HuggingFaceTB/SmolVLM-256M-Instruct), verbatim.

One line: `<|im_start|>` once, then per message "User:" / "Assistant:" (the role capitalised;
no space after the colon when the content starts with an image), the parts in order (`<image>`
for an image) and `<end_of_utterance>\\n`; the generation prompt is a bare "Assistant:".
Content must be a list of parts: a plain string renders as nothing.
"""

TEMPLATE = r"""<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>
{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"""
