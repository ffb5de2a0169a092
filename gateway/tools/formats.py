"""Each model family's tool-call syntax, as its chat template teaches it, and how to pick it.

A `ToolFormat` is a call written as fixed text around a name and an arguments object:

    open + head + NAME + between + ARGUMENTS + tail + close   [separator, next call ...]

    hermes       <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>
                 (Qwen2.5, Qwen3, Qwen-VL; free text may come first; calls one per line)
    llama3_json  {"name": "NAME", "parameters": {...}}
                 (Llama 3.1-3.3 JSON tool calling: the whole answer is one call, or text)

The exact whitespace is the one the template writes for calls in the history, so a call the
model makes renders back byte for byte on the next turn (the prefix cache keeps hitting).

`detect(template)` reads the checkpoint's chat template: a template that writes
`<tool_call>` is hermes, one that asks for `{"name": ..., "parameters": ...}` answers in
Llama 3's header format is llama3_json; anything else has no tool format (requests with
tools are refused with a 400 rather than rendered with a syntax the model never saw).
`resolve(parser, template)` applies the `--tool-call-parser` override.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolFormat:
    """One family's call syntax. `open`/`close` are markers around a call ("" for none);
    `parallel`: several calls may follow each other (joined by `separator`); `text_first`:
    free text may precede the first call (else an answer is text or calls, decided by its
    first character)."""

    name: str
    open: str
    head: str
    between: str
    tail: str
    close: str
    separator: str
    parallel: bool
    text_first: bool

    def call_text(self, name: str, arguments: str) -> str:
        """One call as the model writes it (arguments: compact JSON with ", " / ": ")."""
        return self.open + self.head + name + self.between + arguments + self.tail + self.close


HERMES = ToolFormat(
    name="hermes",
    open="<tool_call>",
    head='\n{"name": "',
    between='", "arguments": ',
    tail="}\n",
    close="</tool_call>",
    separator="\n",
    parallel=True,
    text_first=True,
)
LLAMA3_JSON = ToolFormat(
    name="llama3_json",
    open="",
    head='{"name": "',
    between='", "parameters": ',
    tail="}",
    close="",
    separator="",
    parallel=False,
    text_first=False,
)
FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HERMES, LLAMA3_JSON)}
PARSERS: tuple[str, ...] = ("auto", *FORMATS, "none")  # --tool-call-parser choices


def detect(template: str | None) -> ToolFormat | None:
    """The format a chat template teaches (see the module doc), or None."""
    if not template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if '"parameters"' in template and "<|start_header_id|>" in template:
        return LLAMA3_JSON
    return None


def resolve(parser: str, template: str | None) -> ToolFormat | None:
    """`--tool-call-parser`: "auto" detects from the template, "none" turns tool calling
    off, a format name forces that format. ValueError for an unknown name."""
    if parser == "auto":
        return detect(template)
    if parser == "none":
        return None
    try:
        return FORMATS[parser]
    except KeyError:
        raise ValueError(
            f"unknown tool-call parser {parser!r}; expected one of {', '.join(PARSERS)}"
        ) from None
