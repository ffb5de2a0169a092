"""The affinity key of a request, computed at the ingress: what the router hashes so that
requests about one image, and turns of one conversation, meet the replica holding them.

- With images or videos: the first one's content hash (the decoded pixels' xxh3-128, already
  computed by `gateway.media`). Every question about an image, in any conversation and any
  API, shares it, and the image is the expensive part to recompute (vision tower + prefill).
- Text only: a hash of the conversation's opening (system messages and the first user
  message). Each later turn of the conversation re-sends that opening, so all its turns share
  the key, and so do the KV blocks they share. A Responses-API follow-up
  (`previous_response_id`) is rebuilt into the full conversation before this runs, so it keys
  the same way.
- Empty string: no affinity (the router picks the least-loaded replica).

Cheap: one hash of at most a few KB of text; no tokenization.
"""

from __future__ import annotations

import xxhash

from gateway.engine.request import EngineRequest
from gateway.frontend.chat import ChatRequest, TextPart


def affinity_key(chat: ChatRequest, request: EngineRequest) -> str:
    """The routing key for `request` (built from `chat`); see the module docstring."""
    if request.images:
        return "media:" + request.images[0].content_hash
    opening = xxhash.xxh3_128()
    for message in chat.messages:
        texts = [p.text for p in message.parts if isinstance(p, TextPart)]
        opening.update(f"\x1e{message.role}\x1f{chr(0x1F).join(texts)}".encode())
        if message.role == "user":
            return "text:" + opening.hexdigest()
    return ""
