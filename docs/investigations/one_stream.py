"""One stream at raw speed (issue 41): each stage between raw mlx-lm and a streaming client,
measured in alternated short pairs so that the machine's drift cancels.

    python -m docs.investigations.one_stream [--model DIR] [--pairs 12] [--tokens 128]
        [--stages raw,engine,inproc,process] [--server-arg=FLAG ...] [--variant-arg=FLAG ...]
        [--trace-dir DIR]

Stages, each a process kept up for the whole run (idle while another measures):
- `raw`: mlx-lm's own `BatchGenerator`, one row, over the checkpoint's language model
  (`bench.raw.load_text_model`), the same chat-templated prompt ids the server builds;
- `engine`: the gateway's `Engine` alone in a process (no HTTP), the same request submitted
  as the server's front end builds it, tokens timed as its sink receives them;
- `inproc`: `vision-gateway serve --in-process-engine` (engine thread in the HTTP process);
- `process`: `vision-gateway serve` (the default: the engine in its own process);
- `variant` (only when listed): `serve` with the `--variant-arg` flags added, the A/B of one
  flag against `process` in the same pairs;
the servers read by a plain streaming HTTP client (`bench.hotpath_client.plain_stream`).

Each pair measures every stage once (their order rotating from pair to pair), so each stage's
figure has a raw figure from seconds before or after it; the ratio is taken per pair and the
median and spread over the pairs are reported. Decode: tok/s over the steady window (the
first 10 tokens left out), `--tokens` timed tokens. Text first token (`--ttft`): a
`max_tokens: 1` request's time to its first token; the server's by a plain HTTP client,
from the request's start.

Without `--model` a 28-layer tiny Qwen2.5-VL is built once into /tmp/m/qwen25-deep (deep
enough that raw's step is >= 10 ms on the CPU machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEEP = Path("/tmp/m/qwen25-deep")
STAGES = ("raw", "engine", "inproc", "process")
PROMPT = (
    "Write a long story about a lighthouse keeper who finds a message in a bottle, the "
    "island, the weather, the ships that pass and the people he writes to."
)
SKIP = 10


# ----- the workers (one process each; JSON lines on stdin and stdout) --------------------------


def _prompt_ids(model_dir: str) -> list[int]:
    """The chat-templated prompt the server builds for PROMPT (the checkpoint's template)."""
    from gateway.engine.families import load_model

    family = load_model(model_dir, lazy=True)
    text = family.render([{"role": "user", "content": PROMPT}])
    return family.tokenize(text)


def raw_worker(model_dir: str) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from bench.raw import load_text_model

    model = load_text_model(model_dir)
    ids = _prompt_ids(model_dir)

    def decode(tokens: int) -> dict[str, float]:
        times = raw_token_times(model, ids, SKIP + tokens)
        return {"tok_s": (len(times) - SKIP) / (times[-1] - times[SKIP - 1])}

    def ttft() -> dict[str, float]:
        """As mlx-lm's generate: the prompt but its last token into the cache (no logits),
        then the last token's step and its argmax."""
        cache = make_prompt_cache(model)
        start = time.perf_counter()
        model(mx.array([ids[:-1]]), cache=cache)
        mx.eval([c.state for c in cache])
        logits = model(mx.array([ids[-1:]]), cache=cache)
        mx.eval(mx.argmax(logits[:, -1, :], axis=-1))
        return {"ttft_ms": 1000 * (time.perf_counter() - start)}

    _serve({"decode": decode, "ttft": lambda _: ttft()})


def raw_token_times(model: Any, ids: list[int], max_tokens: int) -> list[float]:
    """Raw mlx-lm: `ids` as one `BatchGenerator` row, greedy; each token's arrival time."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, completion_batch_size=1, prefill_batch_size=1)
    [uid] = gen.insert([ids], max_tokens=[max_tokens])
    times: list[float] = []
    try:
        while responses := gen.next_generated():
            times.extend(time.perf_counter() for r in responses if r.uid == uid)
    finally:
        gen.close()
    return times


def engine_turns(model_dir: str) -> tuple[Any, Callable[[str, int], list[float]]]:
    """A started `Engine` (no warm-up) and a function that runs one greedy request of a user
    message, ignoring EOS, and returns [its start, each token's arrival time...]."""
    from gateway.config import EngineConfig
    from gateway.engine.core import Engine
    from gateway.engine.request import FinishEvent, TokenEvent
    from gateway.frontend.chat import ChatMessage, ChatRequest, TextPart
    from gateway.frontend.prompt import PromptBuilder
    from gateway.metrics import Metrics

    engine = Engine(EngineConfig(model_dir, "bench", warmup=False), Metrics())
    engine.start()
    assert engine.model is not None
    prompts = PromptBuilder(engine.model, 8192, 16)
    count = iter(range(10**9))

    def turn(text: str, max_tokens: int) -> list[float]:
        message = ChatMessage("user", (TextPart(text),))
        chat = ChatRequest.greedy("bench", (message,), max_tokens, ignore_eos=True)
        start = time.perf_counter()
        request = prompts.build(chat, [], f"r{next(count)}", start)
        times: list[float] = [start]
        finished: list[bool] = []  # (the sink runs on the engine thread)

        def sink(event: object) -> None:
            if isinstance(event, TokenEvent):
                now = time.perf_counter()
                times.extend(now for _ in event.token_ids)
            elif isinstance(event, FinishEvent) and event.final:
                finished.append(True)

        engine.submit(request, sink)
        while not finished:
            time.sleep(0.0005)
        return times

    return engine, turn


def engine_worker(model_dir: str) -> None:
    _, turn = engine_turns(model_dir)

    def run(max_tokens: int) -> list[float]:
        return turn(PROMPT, max_tokens)

    def decode(tokens: int) -> dict[str, float]:
        times = run(SKIP + tokens)[1:]
        return {"tok_s": (len(times) - SKIP) / (times[-1] - times[SKIP - 1])}

    def ttft() -> dict[str, float]:
        times = run(1)
        return {"ttft_ms": 1000 * (times[1] - times[0])}

    decode(16)  # the first request compiles what the warm-up would
    _serve({"decode": decode, "ttft": lambda _: ttft()})


def _serve(handlers: dict[str, Any]) -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        print(json.dumps(handlers[ask["do"]](ask.get("tokens", 0))), flush=True)


class Worker:
    """A worker subprocess (`--worker KIND`), asked one measurement at a time."""

    def __init__(self, kind: str, model_dir: str) -> None:
        cmd = [sys.executable, "-m", "docs.investigations.one_stream", "--worker", kind,
               "--model", model_dir]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self._line())["ready"]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("worker exited")
        return line

    def ask(self, do: str, tokens: int = 0) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"do": do, "tokens": tokens}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


# ----- the servers -------------------------------------------------------------------------------


class Served:
    """A `vision-gateway serve` measured by a plain streaming client."""

    def __init__(self, model_dir: str, flags: list[str]) -> None:
        from bench.server import LocalServer

        self.server = LocalServer(["--model", model_dir, "--served-model-name", "bench", *flags])

    def ask(self, do: str, tokens: int = 0) -> dict[str, float]:
        return asyncio.run(self._ask(do, tokens))

    async def _ask(self, do: str, tokens: int) -> dict[str, float]:
        import httpx

        from bench.hotpath_client import plain_stream

        messages = [{"role": "user", "content": PROMPT}]
        async with httpx.AsyncClient(base_url=self.server.base_url + "/v1", timeout=300) as http:
            if do == "ttft":
                one = await plain_stream(http, messages, 1, temperature=0)
                assert one.ttft_ms is not None, one.error
                return {"ttft_ms": one.ttft_ms}
            run = await plain_stream(http, messages, SKIP + tokens, temperature=0, ignore_eos=True)
            times = list(run.times)
            assert len(times) > SKIP + 1, run.error
            return {"tok_s": (len(times) - SKIP) / (times[-1] - times[SKIP - 1])}

    def stop(self) -> None:
        self.server.stop()


# ----- the run -----------------------------------------------------------------------------------


def build_deep() -> str:
    """The 28-layer tiny Qwen2.5-VL (built once)."""
    if (DEEP / "config.json").exists():
        return str(DEEP)
    from gateway.offline_model import build_model, shapes

    shapes._TEXT[("qwen2_5_vl", "tiny")] = {
        **shapes._TEXT[("qwen2_5_vl", "tiny")],
        "num_hidden_layers": 28,
    }
    build_model(DEEP, "qwen2_5_vl", "tiny", 0)
    return str(DEEP)


def start(
    stage: str, model_dir: str, flags: list[str], variant: list[str], trace_dir: Path | None
) -> Any:
    if stage in ("raw", "engine"):
        return Worker(stage, model_dir)
    extra = {"inproc": ["--in-process-engine"], "variant": variant}.get(stage, [])
    if trace_dir is not None:  # each server's own engine steps, to compare them directly
        extra = [*extra, f"--step-trace={trace_dir / f'steps-{stage}.jsonl'}"]
    return Served(model_dir, ["--no-disk-cache", *extra, *flags])


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=4) if len(ordered) >= 4 else [ordered[0], 0, ordered[-1]]
    return {
        "median": round(statistics.median(ordered), 3),
        "q1": round(q[0], 3),
        "q3": round(q[2], 3),
        "min": round(ordered[0], 3),
        "max": round(ordered[-1], 3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    model_dir = args.model or build_deep()
    stages = [s for s in args.stages.split(",") if s]
    assert stages[0] == "raw", "raw is the reference: list it first"
    if args.trace_dir is not None:
        args.trace_dir.mkdir(parents=True, exist_ok=True)
    up = {s: start(s, model_dir, args.server_arg, args.variant_arg, args.trace_dir) for s in stages}
    pairs: list[dict[str, dict[str, float]]] = []
    try:
        for stage in stages:  # warm every stage once (kernels, first requests)
            up[stage].ask("decode", 16)
        for i in range(args.pairs):
            order = stages[i % len(stages) :] + stages[: i % len(stages)]
            got: dict[str, dict[str, float]] = {}
            for stage in order:
                got[stage] = up[stage].ask("decode", args.tokens)
                if args.ttft:
                    got[stage].update(up[stage].ask("ttft"))
            pairs.append(got)
            line = " ".join(f"{s} {got[s]['tok_s']:.1f}" for s in stages)
            print(f"pair {i + 1}/{args.pairs} tok/s: {line}", file=sys.stderr, flush=True)
    finally:
        for worker in up.values():
            worker.stop()
    report: dict[str, Any] = {"model": model_dir, "pairs": len(pairs), "tokens": args.tokens}
    for stage in stages:
        report[stage] = {"tok_s": summary([p[stage]["tok_s"] for p in pairs])}
        report[stage]["ratio_to_raw"] = summary(
            [p[stage]["tok_s"] / p["raw"]["tok_s"] for p in pairs]
        )
        if args.ttft:
            report[stage]["ttft_ms"] = summary([p[stage]["ttft_ms"] for p in pairs])
            report[stage]["ttft_over_raw_ms"] = summary(
                [p[stage]["ttft_ms"] - p["raw"]["ttft_ms"] for p in pairs]
            )
    report["raw_samples"] = [p["raw"] for p in pairs]
    if args.trace_dir is not None:  # the engine's own one-row step period, per server
        from docs.investigations.decode_alternate import engine_step_ms

        for stage in stages:
            trace = args.trace_dir / f"steps-{stage}.jsonl"
            if trace.exists():
                report[stage]["engine_step_ms_1row"] = engine_step_ms(trace, [1])["1"]
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model")
    p.add_argument("--pairs", type=int, default=12)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--ttft", action="store_true", help="also the text first token")
    p.add_argument("--server-arg", action="append", default=[])
    p.add_argument(
        "--variant-arg",
        action="append",
        default=[],
        help="a flag of the `variant` stage: `serve` (the default) with these flags added, "
        "for an A/B of one flag in alternated pairs (e.g. --stages raw,process,variant "
        "--variant-arg=--max-batch=32)",
    )
    p.add_argument(
        "--trace-dir",
        type=Path,
        help="each server stage writes its engine's step trace (`--step-trace`) here, as "
        "steps-STAGE.jsonl: the engine's own decode step of each, read with "
        "`decode_alternate.engine_step_ms`",
    )
    p.add_argument("--worker", choices=("raw", "engine"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "raw":
        raw_worker(args.model)
    elif args.worker == "engine":
        engine_worker(args.model)
    else:
        print(json.dumps(run(args), indent=1))


if __name__ == "__main__":
    main()
