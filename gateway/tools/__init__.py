"""Tool calling below the wire formats: the tools a request offers (`spec`), each model
family's call syntax (`formats`), the llguidance grammar that makes every call valid
(`grammar`) and the streaming split of an answer into text and calls (`calls`).

No MLX and no HTTP here; the API parsers build `ToolSet`s, the prompt builder renders them
with the checkpoint's chat template and constrains decoding with `tool_grammar`, and the API
renderers split the answer with `CallSplitter`.
"""
