"""Structured output at the HTTP edge: OpenAI's `response_format` -> an llguidance grammar.

No MLX and no tokenizer here: the grammar is validated and serialized at the edge, compiled for
the model's tokenizer by the engine (gateway.engine.tokens.grammar).
"""
