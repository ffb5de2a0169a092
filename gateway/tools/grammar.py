"""A request's tools -> the llguidance grammar that decoding runs under, so every call the
model makes is in its family's syntax, names one of the tools and has arguments that
validate against that tool's JSON Schema.

    auto      free text, or (hermes) free text then calls: the text may not contain the
              call marker, and once the marker is written the call is forced through
              (llguidance's lazy lexeme: the text ends at the first marker);
              (llama3_json) text that does not start with "{", or one call
    required  calls only, from the first token (one call without parallel calls)
    named     exactly one call of the named tool, from the first token

After the last call only an end-of-sequence token is allowed. Arguments use the structured
output's fixed separators (", " and ": ", no other whitespace), so a schema whose values are
bounded closes in a bounded number of tokens. A marker the tokenizer has as one token (Qwen3's
`<tool_call>`) is referenced as that token (llguidance's `<...>` syntax: its text never
matches a string literal); other markers are plain text.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from gateway.structured.response_format import JSON_OPTIONS
from gateway.tools.formats import ToolFormat
from gateway.tools.spec import ToolSet

# Any text without the call marker (the negation keeps a marker spelled in pieces out of the
# free text, so the answer's split into text and calls is unambiguous).
_TEXT_WITHOUT = "TEXT: /(?s:.*)/ & ~/(?s:.*){marker}(?s:.*)/"


def _lit(text: str) -> str:
    """A Lark string literal (ASCII: names and markers are)."""
    return json.dumps(text)


_META = set("\\.+*?()|[]{}^$#&-~/")


def _regex_escape(text: str) -> str:
    """`text` as a literal inside a `/.../` regex (Rust syntax: only metacharacters are
    escaped; `\\<` would be a word boundary there)."""
    return "".join(f"\\{c}" if c in _META else c for c in text)


def tool_grammar(fmt: ToolFormat, tools: ToolSet, is_token: Callable[[str], bool]) -> str:
    """The Lark grammar (llguidance dialect) for `tools` in `fmt`. `is_token(marker)` says
    whether the tokenizer has `marker` as one added token. Pure."""

    def marker(text: str) -> str:
        # llguidance names a token `<...>` by its text when that text is so bracketed.
        return text if is_token(text) and text.startswith("<") else _lit(text)

    rules = ["%llguidance {}"]
    bodies = []
    for i, tool in enumerate(tools.offered()):
        schema = {**tool.parameters, "x-guidance": JSON_OPTIONS}
        rules.append(
            f"c{i}: {_lit(fmt.head + tool.name + fmt.between)} %json {json.dumps(schema)} "
            f"{_lit(fmt.tail)}"
        )
        bodies.append(f"c{i}")
    close = f" {marker(fmt.close)}" if fmt.close else ""
    rules.append(f"body: ({' | '.join(bodies)}){close}")
    open_ = marker(fmt.open) if fmt.open else ""
    many = tools.many and fmt.parallel
    sep = _lit(fmt.separator) if fmt.separator else ""
    more = f" ({sep} {open_} body)*" if many else ""
    if tools.choice.mode in ("required", "named"):
        rules.append(f"start: {open_} body{more}")
    elif fmt.text_first:
        lazy = "" if open_ == fmt.open else "[lazy]"  # a token ends the text by itself
        head = f"head{lazy}: TEXT {open_}"
        rules += [f"start: TEXT | head body{more}", head]
        rules.append(_TEXT_WITHOUT.format(marker=_regex_escape(fmt.open)))
    else:  # the answer's first character decides: "{" starts the call
        rules += ["start: TEXT | body", "TEXT: /([^{](?s:.*))?/"]
    return "\n".join(rules) + "\n"
