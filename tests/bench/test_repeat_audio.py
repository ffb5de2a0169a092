"""`python -m bench repeat-audio` end to end on the tiny Gemma 4 (servers started by the
bench itself): it completes both cache configurations and both formats, the cached warm turns
read the clip's blocks, and every cached answer equals the uncached one (the bench exits
non-zero otherwise). A smoke test of the bench, not a timing."""

from __future__ import annotations

import json
from pathlib import Path

from support import tiny_model


def test_repeat_audio_runs_and_cached_answers_equal_uncached(tmp_path: Path) -> None:
    from bench.cli import main

    out = tmp_path / "audio.json"
    model = str(tiny_model("gemma4"))
    main(
        ["repeat-audio", "--model", model, "--seconds", "2", "--max-tokens", "3", "--out", str(out)]
    )
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"none", "both"}
    for name, formats in data["results"].items():
        assert set(formats) == {"wav", "flac"}
        for result in formats.values():
            assert len(result["ttft_ms"]) == 5
            warm = result["cached_tokens"][1]
            assert warm > 0 if name == "both" else warm == 0
    assert data["differing_answers"] == {
        f"{c}/{f}": 0 for c in ("none", "both") for f in ("wav", "flac")
    }
