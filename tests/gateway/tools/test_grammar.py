"""The tool grammar (gateway.tools.grammar) over the tiny checkpoints' real tokenizers.

Pinned: valid calls are accepted and end the answer; an unknown name, arguments that break the
schema, free text after the marker or after a call are refused; `auto` allows plain text but
not the marker spelled inside it; `required` refuses text; a named choice allows only its
tool, exactly once (parallel calls or not); without parallel calls a second call is refused;
Qwen3's `<tool_call>` is one token and Qwen-VL's is text, both handled; random walks under the
mask always end in a valid call.
"""

from __future__ import annotations

import json
import random

import jsonschema
import llguidance.hf
import numpy as np
import pytest
from llguidance import LLMatcher
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
from support import tiny_model
from transformers import AutoTokenizer

from gateway.tools.calls import CallSplitter
from gateway.tools.formats import HERMES, LLAMA3_JSON, ToolFormat
from gateway.tools.grammar import tool_grammar
from gateway.tools.spec import ToolChoice, ToolSet, check_tool

CLICK = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 1023},
        "button": {"enum": ["left", "right"]},
    },
    "required": ["x", "button"],
    "additionalProperties": False,
}
TYPE = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 6}}}
TOOLS = (
    check_tool("click", "", CLICK, True, "tools[0]", "parameters"),
    check_tool("type_text", "", TYPE, True, "tools[1]", "parameters"),
)
SCHEMAS = {"click": CLICK, "type_text": {**TYPE, "additionalProperties": False}}


class Checker:
    def __init__(self, arch: str, eos: str) -> None:
        self.tok = AutoTokenizer.from_pretrained(tiny_model(arch))
        self.eos = self.tok.convert_tokens_to_ids(eos)
        self.llt = llguidance.hf.from_tokenizer(self.tok, n_vocab=len(self.tok), eos_token=self.eos)
        self.added = set(self.tok.get_added_vocab())

    def grammar(self, fmt: ToolFormat, choice: ToolChoice, parallel: bool = True) -> str:
        return tool_grammar(fmt, ToolSet(TOOLS, choice, parallel), self.added.__contains__)

    def accepts(self, grammar: str, text: str) -> bool:
        """`text` then end of sequence is a complete answer under `grammar`."""
        matcher = LLMatcher(self.llt, grammar, log_level=0)
        ids = self.tok.encode(text, add_special_tokens=False)
        return all(matcher.consume_token(t) for t in [*ids, self.eos]) and not matcher.is_error()


@pytest.fixture(scope="module", params=[("qwen3", "<|im_end|>"), ("qwen2_vl", "<|im_end|>")])
def qwen(request: pytest.FixtureRequest) -> Checker:
    return Checker(*request.param)


def _call(name: str, args: dict) -> str:
    return HERMES.call_text(name, json.dumps(args))


def test_hermes_auto(qwen: Checker) -> None:
    g = qwen.grammar(HERMES, ToolChoice("auto"))
    ok = _call("click", {"x": 3, "button": "left"})
    assert qwen.accepts(g, "just text, no call")
    assert qwen.accepts(g, "thinking... " + ok)
    assert qwen.accepts(g, ok + "\n" + _call("type_text", {"text": "hi"}))
    assert not qwen.accepts(g, _call("clack", {"x": 3, "button": "left"}))
    assert not qwen.accepts(g, _call("click", {"x": 3000, "button": "left"}))
    assert not qwen.accepts(g, _call("click", {"x": 3}))
    assert not qwen.accepts(g, "text <tool_call> not a call")
    assert not qwen.accepts(g, ok + " and more text")


def test_hermes_required_named_and_single(qwen: Checker) -> None:
    ok = _call("click", {"x": 3, "button": "left"})
    required = qwen.grammar(HERMES, ToolChoice("required"))
    assert qwen.accepts(required, ok)
    assert not qwen.accepts(required, "text")
    assert not qwen.accepts(required, "text " + ok)
    named = qwen.grammar(HERMES, ToolChoice("named", "type_text"))
    assert qwen.accepts(named, _call("type_text", {"text": "hi"}))
    assert not qwen.accepts(named, ok)
    single = qwen.grammar(HERMES, ToolChoice("required"), parallel=False)
    assert qwen.accepts(single, ok)
    assert not qwen.accepts(single, ok + "\n" + ok)


def test_a_named_choice_is_exactly_one_call_even_with_parallel_calls(qwen: Checker) -> None:
    """Invariant: a named tool_choice is one call of that tool and then the end of the answer
    (OpenAI's forced function), whether or not parallel calls are allowed; was: the named tool
    could be called again and again (a tiny model at temperature 1 made 4 calls)."""
    hi = _call("type_text", {"text": "hi"})
    for parallel in (True, False):
        named = qwen.grammar(HERMES, ToolChoice("named", "type_text"), parallel)
        assert qwen.accepts(named, hi)
        assert not qwen.accepts(named, hi + "\n" + hi)
        assert not qwen.accepts(named, hi + "\n")
        assert not qwen.accepts(named, hi + " done")
        assert not qwen.accepts(named, "ok " + hi)
    required = qwen.grammar(HERMES, ToolChoice("required"), parallel=True)
    assert qwen.accepts(required, hi + "\n" + hi)  # `required` alone still allows several


def test_llama3_json() -> None:
    llama = Checker("llama", "<|eot_id|>")
    g = llama.grammar(LLAMA3_JSON, ToolChoice("auto"))
    ok = LLAMA3_JSON.call_text("click", json.dumps({"x": 3, "button": "right"}))
    assert llama.accepts(g, ok)
    assert llama.accepts(g, "plain text")
    assert not llama.accepts(g, ok + ok)
    assert not llama.accepts(g, LLAMA3_JSON.call_text("nope", "{}"))


def test_random_walks_under_the_mask_are_valid_calls(qwen: Checker) -> None:
    """Sample uniformly among allowed tokens (an adversary of sorts): every walk under
    `required` ends (EOS) with calls that parse and validate."""
    g = qwen.grammar(HERMES, ToolChoice("required"), parallel=False)
    rng = random.Random(1)
    mask = allocate_token_bitmask(1, qwen.llt.vocab_size)
    for _ in range(8):
        matcher, ids = LLMatcher(qwen.llt, g, log_level=0), []
        for _ in range(200):
            fill_next_token_bitmask(matcher, mask)
            bits = np.unpackbits(mask[0].view(np.uint8), bitorder="little")
            allowed = np.flatnonzero(bits[: qwen.llt.vocab_size])
            token = int(rng.choice(list(allowed)))
            assert matcher.consume_token(token)
            if token == qwen.eos:
                break
            ids.append(token)
        else:
            pytest.fail("a bounded call did not end in 200 tokens")
        splitter = CallSplitter(HERMES)
        splitter.feed(qwen.tok.decode(ids, skip_special_tokens=True))
        splitter.finish()
        assert len(splitter.calls) == 1 and splitter.text == ""
        call = splitter.calls[0]
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
