#!/usr/bin/env bash
# The paper's tables on the H200 (Qwen2.5-VL-7B shapes, bf16): resolution, text-prefix and
# concurrency (with raw mlx-lm BatchGenerator at the same batch sizes on the same weights),
# all against ONE `vision-gateway serve` started here (one start-up and warm-up instead of
# three), through `--base-url`, exactly as a peer server would be measured. ~4-6 min in all.
# Run from the repo root on the GPU machine after the wheels are installed (see run-h200.sh and
# ../shared/h200/prepare.sh), e.g. in the second device call:
#   bash .whl/install.sh && OUT=$OUT bash docs/bench/run-h200-tables.sh
# Everything lands in $OUT: <scenario>.json / .md / .log, server.log, make-model.log.
# Plots: matplotlib is not on that machine; make them here from the JSON:
#   python -m bench.compare $OUT/resolution.json --plot docs/bench/resolution-h200.png
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/out}
M=${MODEL_DIR:-/tmp/m7b}
PORT=${PORT:-8123}
STEPS=${STEPS:-"resolution text-prefix concurrency"}
mkdir -p "$OUT"
started=$(date +%s)
stamp() { echo "[$(( $(date +%s) - started )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if [ ! -f "$M/config.json" ]; then
  stamp "building $M"
  python3 -m gateway make-model "$M" --arch qwen2_5_vl --size 7b >"$OUT/make-model.log" 2>&1 \
    || { tail -20 "$OUT/make-model.log"; exit 1; }
fi
# Raw first, server not yet loaded: the ceiling is measured on an otherwise idle GPU.
if [[ " $STEPS " == *" concurrency "* ]]; then
  stamp "raw mlx-lm BatchGenerator ceiling"
  timeout 240 python3 -m bench.raw --model "$M" --batch 1 2 4 8 16 32 --decode-tokens 128 \
    --prefix-tokens 1400 --reps 3 >"$OUT/raw.json" 2>"$OUT/raw.log" || tail -5 "$OUT/raw.log"
fi
stamp "starting the server"
python3 -m gateway serve --model "$M" --served-model-name bench --port "$PORT" --max-batch 32 \
  --max-waiting 128 >"$OUT/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 300); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" \
    2>/dev/null && break  # (no curl needed on the GPU machine)
  kill -0 $server 2>/dev/null || { tail -30 "$OUT/server.log"; exit 1; }
  sleep 1
done
stamp "server ready"
URL="http://127.0.0.1:$PORT"
common=(--base-url "$URL" --model bench --raw-model "$M")
for step in $STEPS; do
  stamp "bench $step"
  case $step in
    resolution)
      timeout 150 python3 -m bench resolution --base-url "$URL" --model bench \
        --sizes 224 448 768 1024 --reps 3 --max-tokens 32 \
        --out "$OUT/resolution.json" --markdown "$OUT/resolution.md" 2>&1 | tee "$OUT/resolution.log" ;;
    text-prefix)
      timeout 90 python3 -m bench text-prefix --base-url "$URL" --model bench \
        --prefix-tokens 512 --reps 5 --max-tokens 32 \
        --out "$OUT/text-prefix.json" --markdown "$OUT/text-prefix.md" 2>&1 | tee "$OUT/text-prefix.log" ;;
    concurrency)
      # --raw-json: the ceiling measured above, before the server took the GPU (if that failed,
      # the bench measures raw itself from --raw-model, with the idle server loaded)
      raw=(); [ -s "$OUT/raw.json" ] && raw=(--raw-json "$OUT/raw.json")
      timeout 200 python3 -m bench concurrency "${common[@]}" "${raw[@]}" \
        --levels 1 2 4 8 16 32 --max-tokens 128 --image-size 448 \
        --out "$OUT/concurrency.json" --markdown "$OUT/concurrency.md" 2>&1 | tee "$OUT/concurrency.log" ;;
    repeat-image)  # optional (STEPS=...): the 1024 px conversation table through the same server
      timeout 150 python3 -m bench repeat-image --base-url "$URL" --model bench \
        --images 2 --image-size 1024 --max-tokens 16 \
        --out "$OUT/repeat-image.json" --markdown "$OUT/repeat-image.md" 2>&1 | tee "$OUT/repeat-image.log" ;;
  esac
done
stamp "done"
# A device call returns at most 8 files: everything else travels in one bundle.
tar -C "$OUT" -czf /tmp/bundle.tgz . && find "$OUT" -mindepth 1 -delete && mv /tmp/bundle.tgz "$OUT/bundle.tgz"
