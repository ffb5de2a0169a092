"""Gemma 3n's chat template (google/gemma-3n-E2B-it), as recalled from upstream (not copied from a
downloaded file: nothing here touches the network).

Gemma 3's, except for the media parts: an image part renders as one `<image_soft_token>` and
an audio part as one `<audio_soft_token>` where it stands (the processor expands each into
`\\n\\n<start_of_image>` + the image tokens + `<end_of_image>\\n\\n`, resp. the audio's).
No system role (a system message prefixes the first user turn), strict user/assistant
alternation, the assistant spelled `model`, text parts `trim`med; it starts with `bos_token`.
"""

from . import gemma3

# Gemma 3's text with its image branch replaced by the audio and image parts.
_GEMMA3_IMAGE = """            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}"""
_GEMMA3N_MEDIA = """            {%- if item['type'] == 'audio' -%}
                {{ '<audio_soft_token>' }}
            {%- elif item['type'] == 'image' -%}
                {{ '<image_soft_token>' }}"""
assert gemma3.TEMPLATE.count(_GEMMA3_IMAGE) == 1
TEMPLATE = gemma3.TEMPLATE.replace(_GEMMA3_IMAGE, _GEMMA3N_MEDIA)
