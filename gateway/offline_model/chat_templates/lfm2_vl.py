"""LFM2-VL's chat template, restated from the format Liquid AI documents for LFM2 (ChatML-like):
the BOS once, then per message `<|im_start|>ROLE\\n`, its content (a string, or the parts in
order: `<image>` for an image, a text part's text) and `<|im_end|>\\n`; the generation prompt
is `<|im_start|>assistant\\n`. mlx-vlm's processor expands each `<image>` (tiles, thumbnail,
`<|image_start|>` / `<|image_end|>` markers)."""

TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<image>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
