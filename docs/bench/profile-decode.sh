#!/usr/bin/env bash
# Where a decode step goes through HTTP: `serve` on the 7b-shape checkpoint, one wave of
# STREAMS streamed requests of TOKENS tokens (ignore_eos, plain httpx SSE reader), both server
# processes sampled by py-spy in the middle of the wave (collapsed stacks, every thread, idle
# included), and the engine's step histogram from /metrics before and after. Run on the GPU
# machine after the wheels are installed (see run-h200.sh):
#   STREAMS=32 TOKENS=600 OUT=$OUT bash docs/bench/profile-decode.sh
# Read the stacks with `python3 docs/bench/stacks.py $OUT/engine-stacks.txt`.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/out}; M=${MODEL_DIR:-/tmp/m7b}; PORT=${PORT:-8211}
STREAMS=${STREAMS:-32}; TOKENS=${TOKENS:-600}; SAMPLE_S=${SAMPLE_S:-8}
mkdir -p "$OUT"
[ -f "$M/config.json" ] || python3 -m gateway make-model "$M" --arch qwen2_5_vl --size 7b >"$OUT/make-model.log" 2>&1
python3 -m gateway serve --model "$M" --served-model-name bench --port "$PORT" --max-batch "$STREAMS" \
  ${SERVE_ARGS:-} >"$OUT/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 300); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null && break
  kill -0 $server 2>/dev/null || { tail -30 "$OUT/server.log"; exit 1; }
  sleep 1
done
engine=$(pgrep -P $server -f spawn_main | head -1)
echo "server $server, engine process $engine"
python3 - "$PORT" "$STREAMS" "$TOKENS" "$SAMPLE_S" "$OUT" "$server" "$engine" <<'PY'
import asyncio, json, subprocess, sys, time, urllib.request
from bench.sse import ChatClient
from bench.hotpath_client import aggregate_tok_s, median
port, streams, tokens, sample_s, out, server, engine = sys.argv[1:]
streams, tokens, sample_s = int(streams), int(tokens), float(sample_s)
url = f"http://127.0.0.1:{port}"

def metrics():
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    keep = {}
    for line in text.splitlines():
        if line.startswith(("vision_gateway_engine_step_seconds_sum", "vision_gateway_engine_step_seconds_count",
                            "vision_gateway_decode_steps_total", "vision_gateway_generation_tokens_total")):
            name, value = line.rsplit(" ", 1)
            keep[name] = float(value)
    return keep

async def wave(n, t):
    client = ChatClient.open(url, "bench")
    try:
        return await asyncio.gather(*[client.chat([{"role": "user", "content": f"Count to a thousand, take {i}."}], t)
                                      for i in range(n)])
    finally:
        await client.aclose()

asyncio.run(wave(streams, 32))  # warm this batch size
before = metrics()
spies = []
async def main():
    task = asyncio.create_task(wave(streams, tokens))
    await asyncio.sleep(2.0)
    for pid, name, extra in ((engine, "engine", []), (server, "http", [])):
        spies.append(subprocess.Popen(["py-spy", "record", "-p", pid, "--threads", "--idle", "--nonblocking",
            "--rate", "250", "--duration", str(int(sample_s)), "--format", "raw", "-o", f"{out}/{name}-stacks.txt"],
            stdout=subprocess.DEVNULL, stderr=open(f"{out}/py-spy-{name}.log", "w")))
    return await task
t0 = time.perf_counter()
result = asyncio.run(main())
wall = time.perf_counter() - t0
for s in spies:
    s.wait()
after = metrics()
delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
summary = {"streams": streams, "tokens": tokens, "wall_s": wall,
           "aggregate_tok_s": aggregate_tok_s(result), "per_stream_tok_s": median([s.tok_s for s in result]),
           "metrics_delta": delta}
steps = delta.get("vision_gateway_engine_step_seconds_count", 0)
if steps:
    summary["mean_step_ms"] = 1000 * delta["vision_gateway_engine_step_seconds_sum"] / steps
print(json.dumps(summary, indent=1))
open(f"{out}/profile-decode.json", "w").write(json.dumps(summary, indent=1))
PY
