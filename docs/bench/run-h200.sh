#!/usr/bin/env bash
# One H200 device call for the hot-path numbers in docs/performance.md (run from the repo root
# after the two wheel-carrying calls of ../shared/h200/prepare.sh; the second runs this):
#   bash .whl/install.sh && OUT=$OUT bash docs/bench/run-h200.sh
# Issues 41 and 40 (one stream at raw speed; --kv-bits refused on CUDA), in one call:
#   STEPS="one_stream decode_alternate kv_bits" ALT_ROUNDS=2 OUT=$OUT bash docs/bench/run-h200.sh
# Builds the Qwen2.5-VL-7B-shape checkpoint (random bf16 weights, ~40 s), then runs
# `bench hotpath` (raw mlx-lm ceiling on the same weights in a subprocess, then the server
# through the streaming openai client) with a py-spy profile of the server process, the
# vision-tower timing, and `bench engine --raw`. Everything lands in $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STEPS=${STEPS:-"hotpath tower engine exact"}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "$STEPS" != gemma3 ] && [ ! -f /tmp/m7b/config.json ]; then  # every other step runs it
  python3 -m gateway make-model /tmp/m7b --arch qwen2_5_vl --size 7b >"$OUT/make-model.log" 2>&1 \
    || { tail -20 "$OUT/make-model.log"; exit 1; }
fi
for step in $STEPS; do
  case $step in
    hotpath)
      # Profile both server processes for the whole bench: the engine process (spawned by
      # `serve`) with every thread, idle included; the HTTP process by GIL holder.
      [ "${PROFILE:-1}" = 1 ] && ( for _ in $(seq 120); do eng=$(pgrep -f spawn_main | head -1); [ -n "$eng" ] && break; sleep 1; done
        py-spy record -p "$eng" --threads --idle --nonblocking --rate 200 --duration "${PROFILE_S:-240}" \
          --format raw -o "$OUT/engine-profile.txt" >"$OUT/py-spy-engine.log" 2>&1 ) &
      [ "${PROFILE:-1}" = 1 ] && ( for _ in $(seq 120); do pid=$(pgrep -f "gateway serve" | head -1); [ -n "$pid" ] && break; sleep 1; done
        py-spy record -p "$pid" --threads --gil --nonblocking --rate 200 --duration "${PROFILE_S:-240}" \
          --format raw -o "$OUT/http-profile.txt" >"$OUT/py-spy-http.log" 2>&1 ) &
      timeout "${HOTPATH_S:-400}" python3 -m bench hotpath --model /tmp/m7b \
        --out "$OUT/hotpath.json" --plot "$OUT/hotpath.png" ${HOTPATH_ARGS:-} 2>&1 | tee "$OUT/hotpath.log"
      pkill -f py-spy; wait; true ;;
    hotpath_cudnn)  # the same bench with cuDNN attention on: the A/B for --cudnn-attention
      timeout "${HOTPATH_S:-400}" python3 -m bench hotpath --model /tmp/m7b \
        --server-arg=--cudnn-attention --out "$OUT/hotpath-cudnn.json" 2>&1 | tee "$OUT/hotpath-cudnn.log" ;;
    tower)
      timeout 120 python3 -m docs.investigations.vision_tower /tmp/m7b --sizes 448 1024 2>&1 | tee "$OUT/tower.log" ;;
    decode_ab)
      timeout 300 python3 -m docs.investigations.decode_ab --model /tmp/m7b --streams 1 16 32 \
        --variant=default --variant=--in-process-engine 2>&1 | tee "$OUT/decode_ab.log" ;;
    exact)  # issue 14: what exact reuse costs in the engine (default: on, 256-row blocks on a
      # GPU; against off and 32-row blocks), then cached == uncached through the server
      for flags in --no-exact-cache --kv-block-tokens=32; do
        timeout 80 python3 -m bench engine --model /tmp/m7b --image-size 1024 --batch 1 \
          --reps 3 --server-arg=$flags --out "$OUT/engine${flags//[-=]/_}.json" 2>&1 | tail -10
      done 2>&1 | tee "$OUT/exact.log"
      for flags in --exact-cache ${EXACT_CONTROL:+--no-exact-cache}; do
        timeout 120 python3 -m bench repeat-image --model /tmp/m7b --images 2 --image-size 1024 \
          --configs none,both --server-arg=--no-warmup --server-arg=$flags \
          --out "$OUT/repeat${flags//-/_}.json" 2>&1 | tail -25
      done 2>&1 | tee -a "$OUT/exact.log" ;;
    invariance)  # batched == single: a shared final-block forward and whole requests
      timeout 240 python3 -m docs.investigations.invariance --model /tmp/m7b --requests 16 --tokens 64 \
        --lengths 20 120 --out "$OUT/invariance.json" 2>&1 | tail -30 | tee "$OUT/invariance.log" ;;
    agent_loop)  # issue 26: a 10-turn agent loop, a 1024 px screenshot per turn, caches on/off
      timeout 420 python3 -m bench agent-loop --model /tmp/m7b --out "$OUT/agent-loop-h200.json" \
        --markdown "$OUT/agent-loop-h200.md" 2>&1 | tail -20 | tee "$OUT/agent-loop.log" ;;
    structured_tools)  # issue 26: what the tool grammar costs per decode step (engine alone)
      timeout 240 python3 -m docs.investigations.structured --model /tmp/m7b --batch 1 16 \
        --tokens 128 --repeat 2 --tools --json "$OUT/structured-tools-h200.json" 2>&1 \
        | tail -20 | tee "$OUT/structured-tools.log" ;;
    structured)  # issue 13: what a grammar costs per decode step (engine alone)
      timeout 300 python3 -m docs.investigations.structured --model /tmp/m7b --batch 1 16 --tokens 256 \
        --repeat 3 --json "$OUT/structured-h200.json" 2>&1 | tee "$OUT/structured.log" ;;
    soak)  # the same load in the foreground, for a call that must not leave the machine idle
      timeout $(( ${SOAK_S:-420} + 120 )) python3 -m bench load --model /tmp/m7b --clients 32 \
        --seconds "${SOAK_S:-420}" ${SOAK_ARGS:-} --out "$OUT/load.json" --plot "$OUT/load.png" \
        >"$OUT/load.log" 2>&1; tail -20 "$OUT/load.log" ;;
    decode_life)  # decode waves between rounds of image turns: does the server's history slow it?
      timeout "${LIFE_S:-300}" python3 -m docs.investigations.decode_life --model /tmp/m7b \
        --server-arg=--step-trace="$OUT/life-steps.jsonl" 2>&1 | tee "$OUT/decode_life.log" ;;
    disk_load)  # what a KV disk hit costs the engine thread at 7B shapes (no model)
      timeout 120 python3 -m docs.investigations.disk_load --repeats 7 2>&1 | tee "$OUT/disk_load.log" ;;
    soak_start)  # the engine process under load for SOAK_S s, detached: collect with soak_collect
      mkdir -p /tmp/soak
      setsid nohup python3 -m bench load --model /tmp/m7b --clients 32 \
        --seconds "${SOAK_S:-630}" ${SOAK_ARGS:-} --out /tmp/soak/load.json --plot /tmp/soak/load.png \
        >/tmp/soak/load.log 2>&1 < /dev/null &
      sleep 2; echo "soak started" ;;
    soak_collect)
      while pgrep -f "bench load" >/dev/null; do sleep 5; done
      cp /tmp/soak/* "$OUT/"; tail -15 "$OUT/load.log" ;;
    block_cost)  # one prefill forward by path (cold prefill: blocks vs one forward)
      timeout 200 python3 -m docs.investigations.block_cost --model /tmp/m7b --reps 4 \
        >"$OUT/block-cost.json" 2>"$OUT/block-cost.log"; cat "$OUT/block-cost.json" ;;
    decode_alternate)  # issue 27 target 1: raw and the server alternated, round by round
      timeout "${ALT_S:-420}" python3 -m docs.investigations.decode_alternate --model /tmp/m7b \
        --rounds "${ALT_ROUNDS:-4}" --step-trace "$OUT/alt-steps.jsonl" 2>&1 | tee "$OUT/decode_alternate.log"
      gzip -f "$OUT/alt-steps.jsonl" ;;
    warm)  # issue 27 target 4: first requests and warm conversations against raw's floor
      timeout "${HOTPATH_S:-400}" python3 -m bench hotpath --model /tmp/m7b --only first \
        --only warm --out "$OUT/hotpath-warm.json" 2>&1 | tail -30 | tee "$OUT/hotpath-warm.log" ;;
    gemma3)  # issue 24: Gemma 3 4B shapes (random bf16), latencies and decode against raw
      [ -f /tmp/g4b/config.json ] || python3 -m gateway make-model /tmp/g4b --arch gemma3 \
        --size 4b >"$OUT/make-g4b.log" 2>&1 || { tail -20 "$OUT/make-g4b.log"; exit 1; }
      timeout "${HOTPATH_S:-480}" python3 -m bench hotpath --model /tmp/g4b --only first \
        --only warm --only decode --out "$OUT/hotpath-gemma3.json" 2>&1 | tail -40 \
        | tee "$OUT/hotpath-gemma3.log" ;;
    one_row)  # issue 27 target 1: where a one-row decode step goes, the server's engine
      # process against raw mlx-lm (py-spy, idle samples included: waiting on the GPU shows)
      ( python3 -m gateway serve --model /tmp/m7b --served-model-name bench --port 8010 \
          >"$OUT/one-row-server.log" 2>&1 & )
      for _ in $(seq 300); do python3 -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:8010/health').status_code != 200)" \
        2>/dev/null && break; sleep 1; done
      python3 -c "import httpx; httpx.post('http://127.0.0.1:8010/v1/chat/completions', timeout=300, json={'model': 'bench', 'messages': [{'role': 'user', 'content': 'Tell a long story.'}], 'max_tokens': 1400, 'ignore_eos': True, 'temperature': 0, 'stream': True})" &
      sleep 6
      py-spy record -p "$(pgrep -f spawn_main | head -1)" --threads --idle --rate 250 --duration 8 \
        --format raw -o "$OUT/one-row-engine.txt" >/dev/null 2>&1
      wait; pkill -f "gateway serve"; sleep 2
      timeout 120 py-spy record --threads --idle --rate 250 --format raw -o "$OUT/one-row-raw.txt" \
        -- python3 -m bench.raw --model /tmp/m7b --decode-only --batch 1 --decode-tokens 1000 \
        --decode-reps 2 2>&1 | tail -3 ;;
    one_stream)  # issue 41: raw / engine alone / in-process server / default server, alternated
      # in pairs (ratio per pair), plus the text first token; then 16 and 32 streams
      timeout "${ONE_S:-360}" python3 -m docs.investigations.one_stream --model /tmp/m7b \
        --pairs "${ONE_PAIRS:-10}" --ttft --server-arg=--no-warmup >"$OUT/one-stream-h200.json" \
        2>"$OUT/one-stream.log"; tail -12 "$OUT/one-stream.log"; cat "$OUT/one-stream-h200.json" ;;
    one_stream2)  # issue 41 follow-up: raw, the default server (warm-up on, as hotpath's and
      # decode_alternate's) and the default server with VARIANT's flags (default --no-warmup,
      # as one_stream's), alternated in pairs; every thread's CPU share sampled by top every 5 s
      ( for _ in $(seq 60); do top -H -b -n 1 -w 200 | head -25; sleep 5; done ) \
        >"$OUT/top-one-stream2.txt" 2>&1 &
      topper=$!
      variant=(); for flag in ${VARIANT:---no-warmup}; do variant+=("--variant-arg=$flag"); done
      # each server's step trace too: its engine's own one-row step, warmed against not
      timeout "${ONE_S:-300}" python3 -m docs.investigations.one_stream --model /tmp/m7b \
        --stages raw,process,variant "${variant[@]}" --pairs "${ONE_PAIRS:-8}" --ttft \
        --trace-dir /tmp/one-stream2-steps >"$OUT/one-stream2.json" 2>"$OUT/one-stream2.log"
      kill "$topper" 2>/dev/null; grep "^pair" "$OUT/one-stream2.log"
      for t in /tmp/one-stream2-steps/*.jsonl; do gzip -c "$t" >"$OUT/one-stream2-$(basename "$t").gz"; done
      grep -o '"engine_step_ms_1row": [0-9.a-z]*' "$OUT/one-stream2.json" ;;
    kv_bits)  # issue 40: --kv-bits on CUDA must be refused at load (quantized attention there
      # computes other values); the server's log says so, or it serves (then the check passed)
      for bits in 8 4; do
        timeout 240 python3 -m gateway serve --model /tmp/m7b --kv-bits "$bits" --port 8011 \
          --no-warmup >"$OUT/kv-bits-$bits.log" 2>&1 &
        for _ in $(seq 200); do grep -q "kv-bits\|Uvicorn running" "$OUT/kv-bits-$bits.log" && break; sleep 1; done
        sleep 2; pkill -f "port 8011"; wait
        grep -m3 "kv-bits\|Uvicorn running" "$OUT/kv-bits-$bits.log"
      done 2>&1 | tee "$OUT/kv-bits.log" ;;
    engine)
      timeout "${ENGINE_S:-150}" python3 -m bench engine --raw --model /tmp/m7b --image-size 1024 \
        --out "$OUT/engine.json" 2>&1 | tee "$OUT/engine.log" ;;
  esac
done
# A device call returns at most 8 files: BUNDLE=1 packs everything into one.
[ "${BUNDLE:-0}" = 1 ] && tar -C "$OUT" -czf /tmp/bundle.tgz . && find "$OUT" -mindepth 1 -delete && mv /tmp/bundle.tgz "$OUT/bundle.tgz"
true
