"""The families' real chat templates, verbatim, one module per family.

Each module holds `TEMPLATE`, the Jinja text the upstream checkpoint ships (its
tokenizer_config.json / chat_template.json), so a tiny checkpoint renders prompts exactly as
the real one does: the same system-prompt handling, image markers, tool sections, reasoning
blocks and quirks (Gemma's strict role alternation, Llama 3.1's fixed date). Rendering is the
tokenizer's (`apply_chat_template`); nothing here evaluates a template.
"""
