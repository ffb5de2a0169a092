"""docs/api.md's examples, run as written against a real server.

Every ```bash and ```python block of the page is extracted and run, from a folder holding a
copy of the repository's fixtures/ (as a user runs them from the repository's root), against
one `vision-gateway serve --allowed-media-dir fixtures` on the embedded tiny model (the
page's own command; only the port differs: the examples' `http://127.0.0.1:8000` is replaced
by the test server's address). An example fails the test when it exits non-zero (the SDKs
raise on an error status) or when its output holds an API error object (curl -s exits 0 on a
400), so a doc example that stops working fails CI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.server import LocalServer

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "api.md"
DOC_URL = "http://127.0.0.1:8000"
_FENCE = re.compile(r"^```(bash|python)\n(.*?)^```$", re.M | re.S)


@dataclass(frozen=True)
class Example:
    """One fenced block of the page: its language, its code and the line it starts on."""

    lang: str
    code: str
    line: int


def examples(markdown: str) -> list[Example]:
    """The page's ```bash and ```python blocks, in page order."""
    return [
        Example(m.group(1), m.group(2), markdown.count("\n", 0, m.start()) + 1)
        for m in _FENCE.finditer(markdown)
    ]


def api_errors(output: str) -> list[Any]:
    """The API error objects in an example's output: the whole output or any SSE `data:`
    line parsed as JSON, with an `error` member or `"type": "error"`."""
    texts = [output, *(line[5:] for line in output.splitlines() if line.startswith("data:"))]
    found = []
    for text in texts:
        try:
            doc = json.loads(text)
        except ValueError:
            continue
        if isinstance(doc, dict) and ("error" in doc or doc.get("type") == "error"):
            found.append(doc)
    return found


EXAMPLES = examples(PAGE.read_text())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in for the repository's root: fixtures/ copied, scratch files (clip.mp4)
    land here rather than in the checkout."""
    folder = tmp_path_factory.mktemp("api-examples")
    shutil.copytree(ROOT / "fixtures", folder / "fixtures")
    return folder


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[LocalServer]:
    # The embedded tiny model, served as "vision-gateway-tiny" (the default: first, pinned),
    # as on the page, with the embedding model and reranker its embeddings and rerank
    # examples name. --no-warmup only shortens the start; the answers do not depend on it.
    from gateway.offline_model import ensure_model

    models = workdir / "models.toml"
    models.write_text(
        f'[models.vision-gateway-tiny]\npath = "{ensure_model()}"\npinned = true\n'
        f'[models.emb]\npath = "{ensure_model("qwen3_vl_embedding")}"\n'
        f'[models.rerank]\npath = "{ensure_model("qwen3_reranker")}"\ntask = "rerank"\n'
    )
    args = ["--models", str(models), "--allowed-media-dir", str(workdir / "fixtures")]
    proc = LocalServer([*args, "--no-warmup"])
    yield proc
    assert proc.stop(), proc.log()


def run_example(example: Example, base_url: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run one block with the page's server address replaced by `base_url`; `python` in a
    bash block is this interpreter (the venv's, as for a user who activated it)."""
    code = example.code.replace(DOC_URL, base_url)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    command = ["bash", "-euo", "pipefail", "-c", code]
    if example.lang == "python":
        command = [sys.executable, "-c", code]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_page_has_runnable_examples_of_each_api() -> None:
    """Invariant: the extraction finds the page's examples (a changed fence style must not
    turn this test into one that runs nothing), each aimed at the documented address."""
    assert {e.lang for e in EXAMPLES} == {"bash", "python"}
    assert len(EXAMPLES) >= 5
    for path in ("/v1/chat/completions", "/v1/messages"):
        assert any(path in e.code for e in EXAMPLES), path
    assert any("responses.create" in e.code for e in EXAMPLES)
    assert all(DOC_URL in e.code for e in EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"api.md:{e.line}" for e in EXAMPLES])
def test_example_runs_as_written(example: Example, server: LocalServer, workdir: Path) -> None:
    """Invariant: the example exits 0 and its output holds no API error."""
    done = run_example(example, server.base_url, workdir)
    report = f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, report
    assert done.stdout.strip(), report
    assert api_errors(done.stdout) == [], report


def test_a_failing_curl_example_is_caught(server: LocalServer, workdir: Path) -> None:
    """Invariant: the checks above fail an example whose request the server refuses (curl -s
    still exits 0): here an image path outside --allowed-media-dir."""
    refused = Example(
        "bash",
        f"curl -s {DOC_URL}/v1/chat/completions -H 'Content-Type: application/json' -d '"
        '{"model": "vision-gateway-tiny", "max_tokens": 4, "messages": [{"role": "user", '
        '"content": [{"type": "image_url", "image_url": {"url": "/etc/hostname"}}]}]}\'',
        0,
    )
    done = run_example(refused, server.base_url, workdir)
    assert done.returncode == 0
    assert api_errors(done.stdout)[0]["error"]["param"] == "messages[0].content[0].image_url.url"
