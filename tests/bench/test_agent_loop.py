"""`bench agent-loop` end to end on CPU, tiny: 3 turns of 112 px screenshots with the caches
on and off, each configuration on a server the bench starts (the tiny Qwen2-VL).

Pinned: every turn is a forced tool call that the next turn sends back with a new
screenshot; with the caches on, turns after the first reuse the previous prefix (cached
tokens) and encode only the one new screenshot, with them off nothing is reused and every
screenshot is encoded again; the calls are identical either way; the table, JSON and plot
are written. Speed is not asserted (that is the docs' table, from a real run).
"""

from __future__ import annotations

import importlib.util
import json

import jsonschema

from bench.agent_loop import TOOLS, screenshot_uri
from bench.cli import main

HAS_PLOT = importlib.util.find_spec("matplotlib") is not None


def test_agent_loop_tiny(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out, png = tmp_path / "a.json", tmp_path / "a.png"
    plot = ["--plot", str(png)] if HAS_PLOT else []
    main(["agent-loop", "--turns", "3", "--image-size", "112", "--max-tokens", "48",
          "--out", str(out), "--markdown", str(tmp_path / "a.md"), *plot])  # fmt: skip
    data = json.loads(out.read_text())
    on, off = data["results"]["caches on"], data["results"]["caches off"]
    assert [r["turn"] for r in on] == [r["turn"] for r in off] == [1, 2, 3]
    assert data["differing_calls"] == []
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for a, b in zip(on, off, strict=True):
        assert a["call"] == b["call"] and a["prompt_tokens"] == b["prompt_tokens"]
        name, arguments = a["call"]
        jsonschema.validate(json.loads(arguments), schemas[name])
        assert a["ttft_ms"] > 0 and b["ttft_ms"] > 0
        assert b["cached_tokens"] == 0 and b["images_encoded"] == a["turn"]
    assert on[0]["images_encoded"] == 1
    for prev, row in zip(on, on[1:]):
        assert row["images_encoded"] == 1  # only the new screenshot
        assert row["prompt_tokens"] > prev["prompt_tokens"]
        assert row["cached_tokens"] >= prev["prompt_tokens"] * 0.9  # the whole previous turn
    assert (tmp_path / "a.md").read_text().count("\n") == 2 + 3
    assert png.exists() == HAS_PLOT


def test_screenshots_differ_by_turn_and_run() -> None:
    assert screenshot_uri(64, 1) != screenshot_uri(64, 2)
    assert screenshot_uri(64, 1, nonce=1) != screenshot_uri(64, 1, nonce=2)
    assert screenshot_uri(64, 1, nonce=1) == screenshot_uri(64, 1, nonce=1)
