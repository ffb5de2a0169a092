"""Embedding models: their engine (`engine.EmbedEngine`), families (`text.TextEmbedder`,
`qwen3_vl.QwenVLEmbedder`, loaded by `loader.load_embedder`) and the call that crosses the
pipe (`request.Embed`)."""
