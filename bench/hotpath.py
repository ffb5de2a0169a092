"""`python -m bench hotpath`: is the gateway's own path nearly free?

One command, in this order:
1. the raw MLX ceiling on the same weights (`bench.raw`, in a subprocess so its
   accelerator memory is gone before the server starts);
2. a `vision-gateway serve` subprocess, measured through HTTP with the streaming `openai`
   client (`hotpath_scenarios`): first requests after start, cold and warm image TTFT, text
   first token, decode at several stream counts, concurrency waves, batched images;
3. raw decode again, after the server (`--no-raw-after` skips it): a lent VM can slow down
   2-3x for minutes (docs/performance.md §8g), and a decode ratio means something only when
   raw's figures before and after agree (`raw_drift_b*` rows, flagged beyond 15%);
4. one table (and JSON, optionally a PNG) where every figure is a ratio to raw MLX measured in
   the same run, or, where raw has no counterpart, a ratio with a target.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.hotpath_report import Row, brief, failed, ratio, report

Log = Callable[[str], None]
TEMPLATE_TOKENS = 24  # chat template + question around an image, roughly (raw prefix length)


@dataclass(frozen=True)
class HotpathSettings:
    """Sizes of the hotpath bench (pixels, tokens, request counts)."""

    image_size: int = 1024  # cold/warm image TTFT (square, by path and data URI)
    new_size: int = 768  # "first image of a new size"
    batch_image_size: int = 448  # the concurrent-images scenario
    turns: int = 5  # conversation turns (2..turns are warm)
    answer_tokens: int = 8  # per conversation turn
    decode_tokens: int = 128  # per decode stream
    decode_reps: int = 3  # decode waves per stream count (the median wave is reported)
    streams: tuple[int, ...] = (1, 16, 32)  # decode concurrency (raw: the same batch sizes)
    sampled_streams: int = 16  # decode at temperature 0.7 (must be one of `streams`)
    wave: int = 16  # first-vs-second concurrent wave
    wave_tokens: int = 32
    image_batch: int = 16  # concurrent distinct images
    reps: int = 3  # repetitions for medians
    max_batch: int = 32  # the server's --max-batch
    budget_s: float = 330.0  # scenarios not started this long after the bench began: skipped
    only: tuple[str, ...] = ()  # run only scenarios whose name starts with one of these
    # Measure raw decode again after the server (a lent VM drifts: the ratios hold only if
    # raw's figures before and after agree; see `drift_rows`).
    raw_after: bool = True


QUICK = HotpathSettings(
    image_size=224,
    new_size=168,
    batch_image_size=112,
    turns=2,
    answer_tokens=4,
    decode_tokens=16,
    decode_reps=1,
    streams=(1, 4),
    sampled_streams=4,
    wave=4,
    wave_tokens=8,
    image_batch=4,
    reps=2,
    max_batch=8,
    budget_s=240.0,
)


def model_dir(model: str) -> Path:
    """A local checkpoint dir for `model` (a dir, or a hub id resolved via the HF cache)."""
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model))


def image_prompt_tokens(root: Path, size: int) -> int:
    """Prompt tokens of a one-image question about a size x size image (image tokens from
    the checkpoint's preprocessor config, as Qwen-VL's resize rule gives them, plus text)."""
    from gateway.processors.image_processor import smart_resize

    config = json.loads((root / "preprocessor_config.json").read_text())
    sizes = config.get("size") or {}
    patch, merge = int(config.get("patch_size", 14)), int(config.get("merge_size", 2))
    low = config.get("min_pixels") or sizes.get("shortest_edge") or 56 * 56
    high = config.get("max_pixels") or sizes.get("longest_edge") or 28 * 28 * 1280
    h, w = smart_resize(size, size, patch * merge, low, high)
    return (h // (patch * merge)) * (w // (patch * merge)) + TEMPLATE_TOKENS


def run_raw(
    root: Path, settings: HotpathSettings, log: Log, quick: bool, decode_only: bool = False
) -> dict[str, Any]:
    """The raw ceiling's JSON from `python -m bench.raw` ({"error": ...} if it
    failed: the bench then reports gateway figures without ratios). `decode_only`: the decode
    figures alone (the re-check after the server)."""
    try:
        prefix = image_prompt_tokens(root, settings.image_size)
    except (OSError, ValueError) as exc:
        prefix = 1400  # Qwen2.5-VL's 1024 x 1024 image plus its question
        log(f"raw ceiling: no image token count ({exc}); prefix {prefix} tokens")
    cmd = [sys.executable, "-m", "bench.raw", "--model", str(root)]
    cmd += ["--batch", *map(str, settings.streams), "--prefix-tokens", str(prefix)]
    cmd += ["--decode-tokens", str(settings.decode_tokens), "--reps", str(2 if quick else 5)]
    cmd += ["--decode-reps", str(settings.decode_reps)]
    cmd += ["--decode-only"] if decode_only else []
    log(f"raw ceiling: {' '.join(cmd[1:])}")
    try:  # stderr (progress) goes straight to our terminal
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=300)
        if done.returncode:
            return {"error": f"raw ceiling exited with {done.returncode}"}
        return json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - reported; the gateway figures still count
        return {"error": f"raw ceiling failed: {type(exc).__name__}: {exc}"}


DRIFT_TOLERANCE = 0.15  # raw before vs after beyond this: the call's decode ratios are suspect


def drift_rows(
    before: dict[str, Any], after: dict[str, Any], streams: tuple[int, ...]
) -> list[Row]:
    """Raw decode after the server over raw before, per batch size: within 1 +- 0.15 the
    machine held still; outside it the decode ratios of this call measure the VM, not the
    gateway (the note says so)."""
    rows = []
    for n in streams:
        key = f"decode_tok_s_b{n}"
        drift = ratio(after.get(key), before.get(key)) if "error" not in after else None
        note = after.get("error", "") or (
            "the machine drifted: decode ratios of this call are suspect"
            if drift is not None and abs(drift - 1) > DRIFT_TOLERANCE
            else f"raw {before.get(key) or 0:.0f} -> {after.get(key) or 0:.0f} tok/s"
        )
        rows.append(
            Row(f"raw_drift_b{n}", f"raw decode {n} rows: after the server / before", "x",
                drift, note=note)
        )  # fmt: skip
    return rows


def _server_args(
    model: str, settings: HotpathSettings, media_dir: Path, extra: list[str]
) -> list[str]:
    """serve flags: enough rows for the largest wave, local images from `media_dir`."""
    streams = max(settings.max_batch, *settings.streams, settings.image_batch, settings.wave)
    return [
        "--model", model, "--served-model-name", "bench",
        "--max-batch", str(streams), "--max-waiting", str(4 * streams),
        "--allowed-media-dir", str(media_dir), *extra,
    ]  # fmt: skip


def measure_server(
    model: str,
    settings: HotpathSettings,
    raw: dict[str, Any],
    log: Log,
    extra: list[str],
    deadline: float,
    save: Callable[[list[Row], dict[str, Any]], None],
) -> tuple[list[Row], dict[str, Any]]:
    """Start the server, run every scenario (`save` after each), stop it. (rows, details)."""
    from openai import AsyncOpenAI

    from bench.hotpath_client import ImageFiles
    from bench.hotpath_scenarios import Scenarios
    from bench.server import LocalServer

    files = ImageFiles()  # the server must allow its dir: created first
    started = time.perf_counter()
    try:
        server = LocalServer(_server_args(model, settings, files.root, extra))
        ready_s = time.perf_counter() - started
        ready = Row("server_ready_s", "server start to /health ok", "s", ready_s)
        log(f"server ready in {ready_s:.1f} s at {server.base_url}")

        async def scenarios() -> Scenarios:
            client = AsyncOpenAI(
                base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120
            )

            def step(done: Scenarios) -> None:
                save([ready, *done.rows], done.details)

            bench = Scenarios(client, files, settings, raw, log, deadline, step)
            async with client:
                await bench.run_all()
            return bench

        try:
            bench = asyncio.run(scenarios())
        finally:
            clean = server.stop()
    finally:
        files.close()
    return [ready, *bench.rows], {**bench.details, "clean_shutdown": clean}


def run(
    model: str,
    settings: HotpathSettings,
    log: Log,
    extra: list[str] | None = None,
    quick: bool = False,
    save: Callable[[dict[str, Any]], None] = lambda _: None,
) -> dict[str, Any]:
    """The whole bench; returns the report payload (see `hotpath_report.report`). `save` gets
    the payload so far after the raw ceiling and after every scenario."""
    from bench.report import machine

    started = time.perf_counter()
    meta = {"machine": machine(), "model": model, "settings": asdict(settings)}

    def payload(rows: list[Row], details: dict[str, Any]) -> dict[str, Any]:
        seconds = round(time.perf_counter() - started, 1)
        return report(rows, **meta, raw=raw, details=details, seconds=seconds)

    root = model_dir(model)
    raw = run_raw(root, settings, log, quick)
    if "error" in raw:
        log(f"raw ceiling: {raw['error']} (continuing without ratios)")
    save(payload([], {}))
    deadline = started + settings.budget_s
    try:
        rows, details = measure_server(
            str(root), settings, raw, log, extra or [], deadline,
            lambda rows, details: save(payload(rows, details)),
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the raw figures are still worth reporting
        rows, details = [failed("server", "server start / scenarios", "-", exc)], {}
    if settings.raw_after and "error" not in raw and any(r.key.startswith("decode_") for r in rows):
        after = run_raw(root, settings, log, quick, decode_only=True)
        meta["raw_after"] = after
        rows = [*rows, *drift_rows(raw, after, settings.streams)]
        for row in rows[-len(settings.streams) :]:
            log(f"  {brief(row)}; {row.note}")
    final = payload(rows, details)
    save(final)
    return final
