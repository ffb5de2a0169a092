#!/usr/bin/env bash
# Side by side on this machine: vision-gateway, mlx-vlm's own server and vllm-mlx
# (--continuous-batching --mllm), on the same tiny Qwen2-VL checkpoint, measured by the same
# client (`python -m bench ... --base-url URL --model NAME`) with the same images:
# repeat-image, concurrency and stall against each. Servers run one at a time and are stopped
# after their benches (and on any exit).
#
#   bash docs/bench/peers.sh [OUT_DIR]      (default docs/bench/peers; run from the repo root,
#                                            after `python3 -m venv .venv && .venv/bin/pip
#                                            install -e '.[cpu,bench]'`)
#
# Each peer gets its own virtualenv under .peers/ (git-ignored), installed as its README says:
#   mlx-vlm:  pip install mlx-vlm==$MLX_VLM 'mlx[cpu]'   ->  python -m mlx_vlm.server --model DIR
#   vllm-mlx: pip install vllm-mlx==$VLLM_MLX 'mlx[cpu]' ->  vllm-mlx serve DIR --continuous-batching --mllm
# PEERS="mlx-vlm vllm-mlx vision-gateway" (default: all three) picks which to run;
# SCENARIOS="repeat-image concurrency stall" likewise.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${1:-docs/bench/peers}
PEERS=${PEERS:-"vision-gateway mlx-vlm vllm-mlx"}
SCENARIOS=${SCENARIOS:-"repeat-image concurrency stall"}
MLX_VLM=${MLX_VLM:-0.7.10}     # the version our pyproject pins
VLLM_MLX=${VLLM_MLX:-0.6.0}
MLX=${MLX:-0.32.4}
VG=.venv/bin/vision-gateway
BENCH=(.venv/bin/python -m bench)  # from the checkout: the benches are not in the wheel
MODEL=$ROOT/.peers/model-qwen2_vl-tiny
mkdir -p .peers/logs "$OUT"   # server logs (large: request previews) stay in .peers/logs
log() { echo "[peers $(date +%H:%M:%S)] $*"; }

[ -f "$MODEL/config.json" ] || { log "building the tiny checkpoint"; $VG make-model "$MODEL" --arch qwen2_vl --size tiny; }

install() {  # name, pip requirements...
  local name=$1; shift
  if [ ! -x ".peers/$name/bin/python" ] || [ ! -f ".peers/$name/.installed" ]; then
    log "installing $name into .peers/$name: $*"
    python3 -m venv ".peers/$name"
    ".peers/$name/bin/pip" install -q "$@" >".peers/$name-install.log" 2>&1 \
      || { tail -20 ".peers/$name-install.log"; return 1; }
    touch ".peers/$name/.installed"
  fi
}

SERVER_PID=
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID"
    for _ in $(seq 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=
}
trap stop_server EXIT

start_server() {  # name, port, command...
  local name=$1 port=$2; shift 2
  log "starting $name: $*"
  setsid "$@" >".peers/logs/$name-server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -30 ".peers/logs/$name-server.log"; return 1; }
    sleep 1
  done
  log "$name did not answer /v1/models in 300 s"; return 1
}

benches() {  # name, label, port, model name
  local name=$1 label=$2 port=$3 served=$4
  local target=(--base-url "http://127.0.0.1:$port" --model "$served" --backend-label "$label"
                --server-pid "$SERVER_PID")
  for scenario in $SCENARIOS; do
    log "$name: bench $scenario"
    case $scenario in
      repeat-image)
        "${BENCH[@]}" repeat-image "${target[@]}" --images 3 --image-size 448 --max-tokens 16 \
          --out "$OUT/repeat-image-$name.json" --markdown "$OUT/repeat-image-$name.md" ;;
      concurrency)
        "${BENCH[@]}" concurrency "${target[@]}" --levels 1 2 4 8 16 32 --max-tokens 128 \
          --image-size 112 --reps 3 --raw-json "$OUT/raw.json" \
          --out "$OUT/concurrency-$name.json" --markdown "$OUT/concurrency-$name.md" ;;
      stall)
        "${BENCH[@]}" stall "${target[@]}" --streams 4 --image-size 448 --max-tokens 160 \
          --out "$OUT/stall-$name.json" --markdown "$OUT/stall-$name.md" ;;
    esac 2>&1 | tee -a "$OUT/bench-$name.log"
  done
}

# Raw mlx-lm BatchGenerator on the same weights, once, with no server running.
if [[ " $SCENARIOS " == *" concurrency "* ]] && [ ! -f "$OUT/raw.json" ]; then
  log "raw mlx-lm BatchGenerator ceiling"
  .venv/bin/python -m bench.raw --model "$MODEL" --batch 1 2 4 8 16 32 \
    --decode-tokens 128 --prefix-tokens 80 --reps 3 >"$OUT/raw.json"
fi

for peer in $PEERS; do
  case $peer in
    vision-gateway)
      start_server vision-gateway 18000 .venv/bin/vision-gateway serve --model "$MODEL" \
        --served-model-name tiny --port 18000 --max-batch 32 --max-waiting 128
      benches vision-gateway "vision-gateway $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("vision-gateway"))')" 18000 tiny ;;
    mlx-vlm)
      install mlx-vlm "mlx-vlm==$MLX_VLM" "mlx[cpu]==$MLX"
      start_server mlx-vlm 18080 .peers/mlx-vlm/bin/python -m mlx_vlm.server --model "$MODEL" \
        --host 127.0.0.1 --port 18080
      benches mlx-vlm "mlx-vlm $MLX_VLM" 18080 "$MODEL" ;;
    vllm-mlx)
      install vllm-mlx "vllm-mlx==$VLLM_MLX" "mlx[cpu]==$MLX"
      start_server vllm-mlx 18081 .peers/vllm-mlx/bin/vllm-mlx serve "$MODEL" \
        --continuous-batching --mllm --host 127.0.0.1 --port 18081
      benches vllm-mlx "vllm-mlx $VLLM_MLX" 18081 "$MODEL" ;;
  esac
  stop_server
done

# Side-by-side tables and plots of whatever ran.
for scenario in $SCENARIOS; do
  files=$(ls "$OUT/$scenario"-*.json 2>/dev/null || true)
  [ -n "$files" ] || continue
  extra=()
  [ "$scenario" = concurrency ] && extra=(--ttft-plot "$OUT/$scenario-ttft.png")
  .venv/bin/python -m bench.compare $files --markdown "$OUT/$scenario.md" \
    --plot "$OUT/$scenario.png" "${extra[@]}"
done
log "done: $OUT"
