"""What the server leaves behind, end to end: real `vision-gateway serve` processes.

Pinned: under umask 022 and 000 every folder the server writes (its embedded model, the disk
tier) is 0700 and every file 0600; a --cache-dir other users can write to stops the server
before it loads anything, with a message naming the fix; the log of requests carrying
secret-looking prompts, URLs (query strings) and data URIs holds none of them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import ImageServer, ServerProcess, data_uri, noise_png, wait_until

from bench.server import LocalServer

SECRET = "hunter2-TOP-SECRET"


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(root: Path) -> tuple[set[int], set[int], int]:
    """(folder modes, file modes, files) of everything under `root`, `root` included."""
    dirs, files, count = set(), set(), 0
    for folder, _, names in os.walk(root):
        dirs.add(stat.S_IMODE(os.stat(folder).st_mode))
        for name in names:
            files.add(stat.S_IMODE(os.stat(Path(folder) / name).st_mode))
            count += 1
    return dirs, files, count


@pytest.mark.parametrize("mask", [0o022, 0o000])
def test_everything_the_server_writes_is_its_users_alone(
    tmp_path: Path, mask: int, umask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: started under umask 022 or 000, the server's embedded model (built in the
    user cache dir) and its disk tier, after answering an image question and writing its
    entries, hold only 0700 folders and 0600 files."""
    home = tmp_path / "user-cache"
    monkeypatch.setenv("VISION_GATEWAY_CACHE", str(home))
    os.umask(mask)  # the server process inherits it
    server = LocalServer(["--cache-dir", str(home / "disk-cache"), "--no-warmup"])
    try:
        image = {"type": "image_url", "image_url": {"url": data_uri(noise_png(3, 84, 56))}}
        server.client().chat.completions.create(
            model="vision-gateway-tiny",
            messages=[{"role": "user", "content": [image, {"type": "text", "text": "hi"}]}],
            max_tokens=2,
        )

        def written() -> bool:
            disk = httpx.get(server.base_url + "/v1/cache/stats", timeout=10).json()["disk"]
            return disk["vision"]["writes"] > 0 and disk["pending_bytes"] == 0

        wait_until(written, 30, message=server.log)
    finally:
        assert server.stop(), server.log()
    dirs, files, count = _modes(home)
    assert (dirs, files) == ({0o700}, {0o600}) and count > 5
    assert any((home / "models").iterdir()) and any((home / "disk-cache").iterdir())


@pytest.mark.parametrize("mode, flag", [(0o777, ""), (0o770, ""), (0o777, "--cache-dir-group")])
def test_a_cache_dir_others_can_write_to_stops_the_server(
    tmp_path: Path, mode: int, flag: str
) -> None:
    """Invariant: a world-writable --cache-dir is refused always, a group-writable one unless
    --cache-dir-group; the server exits before loading the model, saying what to change."""
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(RuntimeError, match="exited early") as failed:
        ServerProcess("--cache-dir", str(folder), *([flag] if flag else []))
    assert "--cache-dir" in str(failed.value) and "chmod" in str(failed.value)
    assert not any(folder.iterdir())  # nothing was written into it


def test_a_group_shared_cache_dir_is_accepted_with_the_flag(tmp_path: Path) -> None:
    """Invariant: with --cache-dir-group a group-writable folder serves; the folders it
    creates there are 2770 (new ones keep the group) and the folder stays closed to others."""
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o770)
    server = ServerProcess("--cache-dir", str(folder), "--cache-dir-group", "--no-warmup")
    assert server.stop(), server.log()
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o770
    assert _modes(folder / "v1")[0] == {0o2770}


def test_the_log_holds_no_prompt_url_query_or_image_bytes(tmp_path: Path) -> None:
    """Invariant: requests whose prompts, image URLs (query strings, a missing file among
    them) and data URIs carry secrets leave none of them in the server's log (INFO level),
    through all three APIs, answered or refused."""
    media = tmp_path / "media"
    media.mkdir()
    (media / "cat.png").write_bytes(noise_png(4, 56, 56))
    images = ImageServer(media)
    server = ServerProcess("--allow-private-urls", "--no-warmup")
    uri = data_uri(noise_png(5, 56, 56))
    secret_uri_part = uri[40:80]
    try:
        client = server.client()
        for url in (
            f"{images.url}/cat.png?token={SECRET}",
            f"{images.url}/missing.png?sig={SECRET}",
            uri,
        ):
            part = {"type": "image_url", "image_url": {"url": url}}
            text = {"type": "text", "text": f"my password is {SECRET}"}
            try:
                client.chat.completions.create(
                    model="test", messages=[{"role": "user", "content": [part, text]}], max_tokens=2
                )
            except Exception:  # noqa: BLE001 - the missing image is a 4xx; what matters is the log
                pass
        client.responses.create(model="test", input=f"the key is {SECRET}", max_output_tokens=2)
        httpx.post(
            server.base_url + "/v1/messages",
            json={
                "model": "test",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": SECRET}],
            },
            timeout=30,
        )
    finally:
        assert server.stop(), server.log()
        images.close()
    log = server.log(10**7)
    assert "POST /v1/chat/completions" in log  # the log was captured
    assert SECRET not in log and secret_uri_part not in log
    assert "token=" not in log and "sig=" not in log
