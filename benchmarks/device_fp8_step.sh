#!/usr/bin/env bash
# A real fp8 training step against the prediction (issues 19 and 20: the NeMo fp8 rows' gap).
# check-step on Llama-shaped 4-layer models, seq 4096, one sequence per micro-batch, two
# micro-batches (the per-GPU shape of NeMo's LLAMA2-7B / LLAMA3-8B TP1 rows), each layer
# compiled: bf16, then fp8 (TE's fp8 linears rebuilt in torch, calibrate/fp8_linear.py) with
# each recipe in $RECIPES. Predicted with the GPU's preset (H100: the measured tables; H200:
# the H100 tables with the H200's own power curve). MODELS: which of llama2 llama3 to run;
# CAST=1 also times the fp8 quantize kernels against a copy (fp8_cast_bandwidth.py);
# SYNC=1 also times each step as check-step did before 2026-11-27 (--sync-phases: the host
# waits after every phase), unprofiled, to show what those waits cost.
# Writes ${OUT:-out/device}/fp8_step_*.json (docs/calibration.md, "An fp8 step").
set -uo pipefail
OUT=${OUT:-out/device}
MODELS=${MODELS:-llama2}
RECIPES=${RECIPES:-delayed tensorwise}
mkdir -p "$OUT"
SM="python3 -m simumax.cli"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv | tee "$OUT/nvidia_smi.csv"
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) SYS=h200-sxm-141gb ;;
  *) SYS=nvidia_h100_80gb_hbm3 ;;
esac
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
for model in $MODELS; do
  case $model in llama2) M=llama2-7b ;; llama3) M=llama3-8b ;; *) echo "unknown model $model"; continue ;; esac
  ARGS=(-m "$M" --set layer_num=4 -y "$SYS" --seq-len 4096 --mbs 1 --mbc 2 --steps 10 --warmup 3 --compile --profile --json)
  $SM check-step "${ARGS[@]}" > "$OUT/fp8_step_${model}_bf16.json" || echo "$model bf16 step failed"
  for r in $RECIPES; do
    $SM check-step "${ARGS[@]}" --fp8 "$r" > "$OUT/fp8_step_${model}_$r.json" || echo "$model fp8 $r step failed"
  done
  if [ "${SYNC:-0}" = 1 ]; then
    PLAIN=()
    for a in "${ARGS[@]}"; do [ "$a" = --profile ] || PLAIN+=("$a"); done
    $SM check-step "${PLAIN[@]}" --sync-phases > "$OUT/fp8_step_${model}_bf16_sync.json" || echo "$model bf16 sync step failed"
    for r in $RECIPES; do
      $SM check-step "${PLAIN[@]}" --sync-phases --fp8 "$r" > "$OUT/fp8_step_${model}_${r}_sync.json" || echo "$model $r sync step failed"
    done
  fi
done
for f in "$OUT"/fp8_step_*.json; do python3 -c "
import json,sys; r=json.load(open(sys.argv[1]))
print(sys.argv[1].split('/')[-1], 'time ms', round(r['step_time_real']*1e3,1), 'pred', round(r['step_time_predicted']*1e3,1), '%+.1f%%'%(100*r['time_error']),
      'GiB', round(r['peak_mem_real']/2**30,2), round(r['peak_mem_predicted']/2**30,2), 'phases', {k: round(v*1e3,1) for k, v in r['phase_time_real'].items()},
      'kinds real', {k: round(v*1e3,1) for k, v in (r['kernel_seconds_real'] or {}).items()},
      'pred', {k: round(v*1e3,1) for k, v in r['kernel_seconds_predicted'].items()}, 'clocks', r['clocks_real'])" "$f"; done
if [ "${CAST:-0}" = 1 ]; then python3 benchmarks/fp8_cast_bandwidth.py || echo "cast benchmark failed"; fi
