"""`python -m docs.investigations.responses_turns`: both paths run 5 turns against a real server and
the table reports them side by side."""

from __future__ import annotations

import pytest
from support import tiny_model

from docs.investigations.responses_turns import main


def test_table_compares_previous_response_id_with_resending(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Invariant: one row per path; both read cached tokens on turns 2-5, and the
    previous_response_id requests are far smaller than those that resend the image."""
    model = str(tiny_model())
    main(
        [
            "--model",
            model,
            "--repeats",
            "1",
            "--image-size",
            "64",
            "--kv-block-tokens",
            "8",
            "--max-tokens",
            "4",
        ]
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    cells = {row.split(" | ")[0][2:]: row.strip("| ").split(" | ") for row in rows[1:]}
    responses = cells["Responses, previous_response_id"]
    chat = cells["Chat Completions, image resent"]
    assert float(responses[1]) > 0 and float(chat[1]) > 0  # TTFT ms
    assert int(responses[4]) > 0 and int(chat[4]) > 0  # cached tokens
    assert int(responses[5]) * 5 < int(chat[5])  # request bytes
