#!/usr/bin/env bash
# Issue 30 on the H200: `bench stall` (N cold 1024 px images sent together into 4 running text
# streams) against the branch point's server and this tree's, alternated, in one device call.
# The branch point's code is a `git archive 47defd8 gateway caches bench` unpacked into .old/
# (carried; ignored by git). Run from the repo root after the wheel-carrying calls of
# ../shared/h200/prepare.sh:   bash .whl/install.sh && OUT=$OUT bash docs/bench/h200-stall.sh
set -uo pipefail
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/out}
ROUNDS=${ROUNDS:-3}
ROOT=$PWD
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ ! -f /tmp/m7b/config.json ]; then
  PYTHONPATH=/tmp/site:$ROOT python3 -m gateway make-model /tmp/m7b --arch qwen2_5_vl --size 7b \
    >"$OUT/make-model.log" 2>&1 || { tail -20 "$OUT/make-model.log"; exit 1; }
fi
serve() {  # tree port: a server of that tree's code on 127.0.0.1:port, warmed up
  (cd "$1" && PYTHONPATH=/tmp/site:$1 exec python3 -m gateway serve --model /tmp/m7b \
    --served-model-name m7b --port "$2" ${SERVE_ARGS:-}) >"$OUT/server-$2.log" 2>&1 &
  for _ in $(seq 400); do
    python3 -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$2/health').status_code != 200)" \
      2>/dev/null && return 0
    sleep 1
  done
  tail -30 "$OUT/server-$2.log"; return 1
}
# SIDES: name:port:tree[:serve flags] (flags with '=', several joined by ','), measured in this order
SIDES=${SIDES:-"old:8001:.old new:8002:."}
for side in $SIDES; do
  IFS=: read -r name port tree flag <<<"$side"
  SERVE_ARGS=${flag//,/ } serve "$ROOT/$tree" "$port" || exit 1
done
# PROFILE_S=N: py-spy samples every side's engine process for N s while the rounds run
# (collapsed stacks in $OUT/engine-NAME.txt; read them with docs/bench/stacks.py).
if [ -n "${PROFILE_S:-}" ]; then
  for side in $SIDES; do
    IFS=: read -r name port tree flag <<<"$side"
    server=$(pgrep -f "gateway serve .*--port $port" | head -1)
    engine=$(pgrep -P "$server" -f spawn_main | head -1)
    py-spy record -p "$engine" --threads --idle --nonblocking --rate 500 --duration "$PROFILE_S" \
      --format raw -o "$OUT/engine-$name.txt" >/dev/null 2>&1 &
  done
  sleep 1
fi
for round in $(seq "$ROUNDS"); do
  for side in $SIDES; do
    IFS=: read -r name port tree flag <<<"$side"
    PYTHONPATH=/tmp/site:$ROOT timeout 240 python3 -m bench stall --base-url "http://127.0.0.1:$port" \
      --model m7b --streams 4 --images 2 --image-size 1024 --max-tokens 256 \
      --out "$OUT/stall-$name-$round.json" 2>&1 | tail -6
  done
done
pkill -f "gateway serve"; wait
tar -czf "$OUT/stall-json.tgz" -C "$OUT" $(cd "$OUT" && ls stall-*.json) && rm -f "$OUT"/stall-*.json
