"""Decode cost of structured output: one decode step with constrained rows against the same
step with free rows, at several batch sizes, the engine alone (in-process, no HTTP).

    python -m docs.investigations.structured [--model DIR] [--batch 1 16] [--tokens 128]
                                             [--tools]

For each batch size B, B requests with the same prompt length decode together:
    free         greedy, `ignore_eos`: exactly --tokens tokens each
    constrained  greedy under a JSON Schema whose `minItems` keeps EOS disallowed, so each
                 also decodes exactly --tokens tokens (every step needs a real mask)
    mixed        half of each (B > 1): constrained and free rows in one batch
  with --tools, instead of constrained/mixed (the tool grammar, gateway/tools/grammar.py):
    tools-none   `tools` offered (rendered in the prompt), `tool_choice: none`, `ignore_eos`:
                 the same prompt as the two below without a grammar (their baseline: the
                 tools make the prompt longer, so `free` is not the same work)
    tools-auto   `tools` offered, `tool_choice: auto`, `ignore_eos`: the lazy grammar (free
                 text that may not contain the call marker) on every step
    tools-call   `tool_choice: required`: a forced call whose arguments hold the schema above
                 (never finished within --tokens, so every step needs a real mask)
The step time is the median gap between a request's consecutive tokens over the steady
window (the first and last few tokens dropped), stamped on the engine thread as tokens are
emitted; `mask us/row` is the CPU time llguidance spent computing masks divided by the masks
computed. Without --model a tiny random checkpoint is built (CPU smoke run); on a GPU pass a
Qwen2.5-VL-7B-shaped one from `vision-gateway make-model OUT --size 7b`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.engine_profile import Probe
from gateway.api.openai.parse import parse_chat_request
from gateway.config import CacheConfig, EngineConfig
from gateway.engine.core import Engine
from gateway.frontend.prompt import PromptBuilder
from gateway.metrics import Metrics

SCHEMAS = {
    # Records of a small table: strings, bounded integers, objects inside an array.
    "records": {
        "type": "array",
        "minItems": 4096,
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 12},
                "qty": {"type": "integer", "minimum": 0, "maximum": 99},
                "unit": {"enum": ["kg", "pcs", "l"]},
            },
            "required": ["name", "qty", "unit"],
            "additionalProperties": False,
        },
    },
}


class _Bench:
    def __init__(self, model: str, max_batch: int) -> None:
        config = EngineConfig(
            model=model,
            served_model_name="bench",
            max_batch=max_batch,
            cache=CacheConfig(vision_enabled=False, prefix_enabled=False),
        )
        self.engine = Engine(config, Metrics())
        self.engine.start(timeout=1800)
        self.prompts = PromptBuilder(self.engine.model, 65536, 512)
        self._ids = 0

    def _body(self, i: int, tokens: int, schema: dict | None, mode: str = "") -> dict:
        body: dict = {
            "model": "bench",
            "messages": [{"role": "user", "content": f"List the table rows, part {i:04d}."}],
            "max_tokens": tokens,
            "temperature": 0,
        }
        if mode.startswith("tools"):
            arguments = {"type": "object", "properties": {"rows": schema}, "required": ["rows"]}
            function = {"name": "save_rows", "parameters": arguments}
            body["tools"] = [{"type": "function", "function": function}]
            body["tool_choice"] = mode.removeprefix("tools-").replace("call", "required")
            body["ignore_eos"] = mode != "tools-call"
        elif schema is None:
            body["ignore_eos"] = True
        else:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "rows", "schema": schema, "strict": True},
            }
        return body

    def round(
        self, constrained: list[bool], tokens: int, schema: dict, mode: str = ""
    ) -> list[float]:
        """One batch of len(constrained) requests (`mode` tools-*: the constrained ones offer
        tools); each request's median steady step (s)."""
        probes = []
        for flag in constrained:
            self._ids += 1
            body = self._body(self._ids, tokens, schema if flag else None, mode if flag else "")
            chat = parse_chat_request(body)
            request = self.prompts.build(chat, [], f"bench-{self._ids}", time.perf_counter())
            probe = Probe()
            self.engine.submit(request, probe.sink)
            probes.append(probe)
        steps = []
        for probe in probes:
            probe.wait(1800)  # raises on an error event
            if len(probe.times) != tokens:
                raise RuntimeError(f"expected {tokens} tokens, got {len(probe.times)}")
            trim = max(2, tokens // 8)
            window = probe.times[trim:-trim]
            steps.append(statistics.median(b - a for a, b in zip(window, window[1:])))
        return steps

    def measure(self, batch: int, mode: str, tokens: int, schema: dict, repeat: int) -> dict:
        flags = {
            "free": [False] * batch,
            "constrained": [True] * batch,
            "mixed": [i % 2 == 0 for i in range(batch)],
            "tools-none": [True] * batch,
            "tools-auto": [True] * batch,
            "tools-call": [True] * batch,
        }[mode]
        masker = self.engine.loaded.grammars.masker  # type: ignore[union-attr]
        self.round(flags, min(tokens, 24), schema, mode)  # warm: kernels for this batch size
        seconds, masks = masker.seconds, masker.masks
        steps = [s for _ in range(repeat) for s in self.round(flags, tokens, schema, mode)]
        masks_done = masker.masks - masks
        return {
            "batch": batch,
            "mode": mode,
            "step_ms": 1000 * statistics.median(steps),
            "mask_us_per_row": 1e6 * (masker.seconds - seconds) / masks_done if masks_done else 0,
        }

    def close(self) -> None:
        self.engine.stop()


def mask_apply_micro(vocab: int, batch: int, iters: int = 200) -> dict:
    """Applying B rows' masks to (B, vocab) logprobs on the device: one batched unpack and
    `where` (what the engine does) against mlx-lm's per-row logits-processor shape (slice
    each row, mask it, concatenate). Median ms per step, evaluated each step."""
    import mlx.core as mx
    import numpy as np

    from gateway.engine.tokens.grammar import Masker

    masker = Masker(vocab, [0])
    rng = np.random.default_rng(0)
    mask = rng.integers(-(2**31), 2**31 - 1, size=(batch, masker.words), dtype=np.int32)
    logprobs = mx.random.normal((batch, vocab))
    mx.eval(logprobs)

    def batched() -> mx.array:
        return masker.apply(logprobs, mask)

    def per_row() -> mx.array:
        rows = [masker.apply(logprobs[i : i + 1], mask[i : i + 1]) for i in range(batch)]
        return mx.concatenate(rows, axis=0)

    out = {"vocab": vocab, "batch": batch}
    for name, fn in (("batched_ms", batched), ("per_row_ms", per_row)):
        times = []
        for _ in range(iters):
            started = time.perf_counter()
            mx.eval(fn())
            times.append(time.perf_counter() - started)
        out[name] = 1000 * statistics.median(times[iters // 10 :])
    return out


def run(
    model: str, batches: list[int], tokens: int, repeat: int, schema_name: str, tools: bool
) -> list[dict]:
    bench = _Bench(model, max(batches))
    rows = []
    try:
        for batch in batches:
            modes = ["free", "constrained"] + (["mixed"] if batch > 1 else [])
            if tools:
                modes = ["free", "tools-none", "tools-auto", "tools-call"]
                # Untimed, whole length: the tools' longer prompt reaches KV shapes the short
                # warm round of `measure` does not; unwarmed, the first tools mode pays them.
                bench.round([True] * batch, tokens, SCHEMAS[schema_name], "tools-none")
            for mode in modes:
                row = bench.measure(batch, mode, tokens, SCHEMAS[schema_name], repeat)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        bench.close()
    return rows


def report(rows: list[dict]) -> str:
    """The table; tool rows are compared with `tools-none` (the same prompt), others with
    `free`."""
    free = {
        (r["batch"], r["mode"]): r["step_ms"] for r in rows if r["mode"].endswith(("free", "none"))
    }
    lines = [
        "| batch | rows | step ms | vs baseline | mask us/row (CPU) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        base = "tools-none" if r["mode"].startswith("tools") else "free"
        ratio = r["step_ms"] / free[(r["batch"], base)]
        lines.append(
            f"| {r['batch']} | {r['mode']} | {r['step_ms']:.2f} | {ratio:.2f}x "
            f"| {r['mask_us_per_row']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="checkpoint directory (default: build a tiny one)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=128, help="tokens per request")
    parser.add_argument("--repeat", type=int, default=2, help="rounds per configuration")
    parser.add_argument("--schema", choices=sorted(SCHEMAS), default="records")
    parser.add_argument("--tools", action="store_true", help="tool grammar modes (see above)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        from gateway.offline_model import build_model

        model = str(build_model(Path(tempfile.mkdtemp()) / "tiny", "qwen2_5_vl", "tiny", 0))
    rows = run(model, args.batch, args.tokens, args.repeat, args.schema, args.tools)
    print(report(rows))
    vocab = json.loads((Path(model) / "config.json").read_text())
    vocab = vocab.get("text_config", vocab).get("vocab_size", vocab.get("vocab_size"))
    for batch in args.batch:
        micro = mask_apply_micro(int(vocab), batch)
        rows.append({"mode": "mask_apply", **micro})
        print(json.dumps(micro), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
