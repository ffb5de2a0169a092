"""Text an incremental reader must hold back: the end of what it has that may still turn
out to begin a marker (a stop string, a tool call's opening) once more text arrives.

Pure; shared by the engine's stop strings (gateway.engine.tokens.output) and the edge's
split of an answer into text and calls (gateway.tools.calls).
"""

from __future__ import annotations


def held_length(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper start of `marker` (0: none;
    never the whole marker: a whole marker is found, not held)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
