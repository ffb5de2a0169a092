"""`python -m docs.investigations.decode_life` on the tiny model (CPU), against a real server.

Pinned: every round reports each stream count with positive tok/s, the image turns really
reach the engine (the server's vision-encoder misses count one per new image: a refused
local path would fail the run instead of passing silently), and the summary compares the
last round with the first.
"""

from __future__ import annotations

import json

from support import tiny_model

from docs.investigations import decode_life


def test_rounds_report_decode_and_images_are_encoded(capsys) -> None:
    decode_life.main(
        ["--model", str(tiny_model("qwen2_5_vl")), "--rounds", "3", "--streams", "1", "2",
         "--tokens", "12", "--waves", "1", "--image-size", "56", "--conversations", "2",
         "--turns", "2"]
    )  # fmt: skip
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    records = [x for x in lines if "round" in x]
    assert [(r["round"], r["streams"]) for r in records] == [
        (0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 2)
    ]  # fmt: skip
    assert all(r["tok_s"] > 0 for r in records)
    # Two new images per round went through the tower (a refused path would have raised).
    assert [r["images_encoded"] for r in records[::2]] == [0, 2, 4]
    summary = lines[-1]["summary"]
    assert set(summary) == {"streams_1_last_over_first", "streams_2_last_over_first"}
