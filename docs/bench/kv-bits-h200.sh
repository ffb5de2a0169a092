#!/usr/bin/env bash
# Issue 40 (--kv-bits) on the H200, after the two wheel-carrying calls of
# ../shared/h200/prepare.sh (the second one runs this):
#   bash .whl/install.sh && STEPS="quality attention engine0" bash docs/bench/kv-bits-h200.sh
# and, in the next call while the machine is warm: STEPS="engine8 engine4 exact" ...
# Builds the Qwen2.5-VL-7B-shape checkpoint (random bf16 weights, ~40 s) once per machine;
# every step writes its log (and JSON) into $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STEPS=${STEPS:-"quality attention engine0 engine8 engine4"}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ ! -f /tmp/m7b/config.json ]; then
  python3 -m gateway make-model /tmp/m7b --arch qwen2_5_vl --size 7b >"$OUT/make-model.log" 2>&1 \
    || { tail -20 "$OUT/make-model.log"; exit 1; }
fi
for step in $STEPS; do
  case $step in
    quality)  # teacher-forced |delta logprob| against full-precision KV, fixed prompts
      timeout 240 python3 -m docs.investigations.kv_quality --model /tmp/m7b --group 64 \
        --image-size 448 2>&1 | grep -v Warning | tee "$OUT/kv-quality.log" ;;
    attention)  # one decode step's attention at these shapes, no model
      timeout 120 python3 -m docs.investigations.kv_attention --reps 30 2>&1 | tee "$OUT/kv-attention.log" ;;
    engine*)  # decode tok/s at 1/16/32 rows, cold and warm TTFT (engine alone): engine0, engine8, engine4
      bits=${step#engine}
      timeout 170 python3 -m bench engine --model /tmp/m7b --image-size 1024 --batch 1 16 32 \
        --decode-tokens 64 --reps 3 --server-arg=--kv-bits=$bits --out "$OUT/kv-engine-b$bits.json" \
        2>&1 | tail -12 | tee "$OUT/kv-engine-b$bits.log" ;;
    exact)  # cached == uncached through HTTP at 8 bits (the bench compares the answers)
      timeout 200 python3 -m bench repeat-image --model /tmp/m7b --images 2 --image-size 1024 \
        --configs none,both --server-arg=--no-warmup --server-arg=--kv-bits=8 \
        --out "$OUT/kv-repeat-b8.json" 2>&1 | tail -25 | tee "$OUT/kv-exact.log" ;;
    *) echo "unknown step $step" ;;
  esac
done
