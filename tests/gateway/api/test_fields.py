"""Field parsers shared by the three APIs (gateway.api.fields) that no API's tests cover on
their own.

Pinned: `keep_alive` (Ollama's) takes seconds as a number or a duration string, maps every
negative value to -1 (until evicted), and refuses anything else with a 400 naming the field.
"""

from __future__ import annotations

import pytest

from gateway.api import fields
from gateway.errors import APIError


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, None), (0, 0.0), (30, 30.0), (2.5, 2.5), ("45s", 45.0), ("5m", 300.0),
     ("1h", 3600.0), ("250ms", 0.25), ("10", 10.0), (-1, -1.0), ("-5m", -1.0), (-0.5, -1.0)],
)  # fmt: skip
def test_keep_alive_is_seconds(value: object, seconds: float | None) -> None:
    body = {} if value is None else {"keep_alive": value}
    assert fields.keep_alive(body) == seconds


@pytest.mark.parametrize("value", ["soon", "", "5 minutes", True, [], {}, float("nan"), "1d"])
def test_keep_alive_refuses_what_is_not_a_duration(value: object) -> None:
    with pytest.raises(APIError) as refused:
        fields.keep_alive({"keep_alive": value})
    assert refused.value.status == 400 and refused.value.param == "keep_alive"
