"""The reasoning items' `encrypted_content`: the thinking sealed with the server's key, and
taken back only when that key sealed it.

Pinned: a sealed blob opens to the same text (any Unicode); a blob altered anywhere, one
sealed with another key, or one that is not base64 is a 400 naming the item's field; the
key lives in the cache folder (0600, 0660 when group-shared), made once and read back by a
second server on the folder, so a blob outlives its server; a damaged key file or no folder
gives a key of the process; a reasoning input item's blob restores the thinking for the
template, taking precedence over its summary.
"""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from gateway.api.responses.parse import parse_responses_request
from gateway.api.responses.sealed import KEY_BYTES, KEY_FILE, ReasoningSeal
from gateway.errors import APIError

THOUGHT = "The user wants a greeting; héllo ✓ is short.\n\nAnswer plainly."
AT = "input[1].encrypted_content"


def _refused(seal: ReasoningSeal, blob: object) -> APIError:
    with pytest.raises(APIError) as info:
        seal.open(blob, AT)
    assert info.value.status == 400 and info.value.param == AT
    return info.value


def test_a_blob_opens_only_with_the_key_that_sealed_it() -> None:
    """Invariant: open(seal(t)) == t; a flipped byte (version, MAC or text), another key's
    blob, a truncated or non-base64 blob and a non-string are 400s naming the field."""
    seal = ReasoningSeal.random()
    blob = seal.seal(THOUGHT)
    assert seal.open(blob, AT) == THOUGHT and THOUGHT not in blob
    assert seal.open(seal.seal(""), AT) == ""
    raw = base64.b64decode(blob)
    for at in (0, 1, 20, 40, len(raw) - 1):
        tampered = raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :]
        _refused(seal, base64.b64encode(tampered).decode())
    assert "not made by this server" in _refused(ReasoningSeal.random(), blob).message
    for bad in (blob[:-8], "gAAAAABo-openai-encrypted", "", "%%%", 3, ["x"]):
        _refused(seal, bad)


def test_the_key_is_kept_in_the_cache_folder(tmp_path: Path) -> None:
    """Invariant: the first server makes a 32-byte key file, 0600 (0660 group-shared), and
    a second server on the folder reads the same key: a blob made by one opens on the
    other (and after a restart)."""
    folder = tmp_path / "cache"
    first = ReasoningSeal.for_folder(folder)
    key = folder / KEY_FILE
    assert key.stat().st_size == KEY_BYTES and stat.S_IMODE(key.stat().st_mode) == 0o600
    second = ReasoningSeal.for_folder(folder)
    assert second.open(first.seal(THOUGHT), AT) == THOUGHT
    assert [p.name for p in folder.iterdir()] == [KEY_FILE]  # no temporary file left
    shared = tmp_path / "group"
    ReasoningSeal.for_folder(shared, group=True)
    assert stat.S_IMODE((shared / KEY_FILE).stat().st_mode) == 0o660


def test_no_folder_or_a_damaged_key_gives_a_key_of_the_process(tmp_path: Path) -> None:
    """Invariant: without a folder, or with a key file of the wrong size, each server seals
    with its own key (logged): their blobs do not open on each other, nothing crashes."""
    (tmp_path / KEY_FILE).write_bytes(b"short")
    for folder in (None, tmp_path):
        one, other = ReasoningSeal.for_folder(folder), ReasoningSeal.for_folder(folder)
        _refused(other, one.seal(THOUGHT))


def test_a_reasoning_input_item_restores_the_thinking() -> None:
    """Invariant: a reasoning item sent back with its blob (as Codex does with store false:
    summary and encrypted_content, no content) gives the next assistant turn that thinking;
    a tampered blob is a 400 naming `input[i].encrypted_content`; without a key, any blob is
    a 400 too."""
    seal = ReasoningSeal.random()
    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}],
            "encrypted_content": seal.seal(THOUGHT)}  # fmt: skip
    body = {"model": "m", "input": [
        {"role": "user", "content": "hi"}, item,
        {"role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
        {"role": "user", "content": "again"}]}  # fmt: skip
    r = parse_responses_request(body, seal)
    assert [m.role for m in r.input] == ["user", "assistant", "user"]
    assert r.input[1].reasoning == THOUGHT
    item["encrypted_content"] = ReasoningSeal.random().seal(THOUGHT)
    for key in (seal, None):
        with pytest.raises(APIError) as info:
            parse_responses_request(body, key)
        assert info.value.param == AT
    item["encrypted_content"] = None  # no blob: the summary stands in
    assert parse_responses_request(body, seal).input[1].reasoning == "short"
