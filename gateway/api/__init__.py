"""The HTTP edge: wire formats in, one protocol-neutral pipeline, wire formats out.

    wire body --(openai.py | anthropic.py)--> ChatRequest (chat.py)
      --(pipeline.py: media, prompt.py, engine submit, admission)--> Admission
      --(openai_responses.py | anthropic_responses.py)--> JSON or SSE

Each wire format owns its parser, its response bodies and its error renderer; everything in
between (limits, media, prompt building, the engine) is shared.
"""
