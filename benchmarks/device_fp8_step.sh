#!/usr/bin/env bash
# A real fp8 training step against the prediction (issues 19 and 20: the NeMo fp8 rows' gap).
# check-step on a Llama2-7B-shaped 4-layer model, seq 4096, one sequence per micro-batch, two
# micro-batches (the per-GPU shape of NeMo's LLAMA2-7B TP1 row), each layer compiled: bf16,
# then fp8 with delayed and with current (tensorwise) scaling, TE's fp8 linears rebuilt in
# torch (calibrate/fp8_linear.py). Predicted with the GPU's preset (H100: the measured tables;
# H200: the H100 tables with the H200's own power curve). Writes ${OUT:-out/device}/fp8_*.json.
set -uo pipefail
OUT=${OUT:-out/device}
mkdir -p "$OUT"
SM="python3 -m simumax.cli"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv | tee "$OUT/nvidia_smi.csv"
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) SYS=h200-sxm-141gb ;;
  *) SYS=nvidia_h100_80gb_hbm3 ;;
esac
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
ARGS=(-m llama2-7b --set layer_num=4 -y "$SYS" --seq-len 4096 --mbs 1 --mbc 2 --steps 10 --warmup 3 --compile --profile --json)
$SM check-step "${ARGS[@]}" > "$OUT/fp8_step_bf16.json" || echo "bf16 step failed"
for r in delayed tensorwise; do
  $SM check-step "${ARGS[@]}" --fp8 "$r" > "$OUT/fp8_step_$r.json" || echo "fp8 $r step failed"
done
for f in "$OUT"/fp8_step_*.json; do python3 -c "
import json,sys; r=json.load(open(sys.argv[1]))
print(sys.argv[1].split('/')[-1], 'time ms', round(r['step_time_real']*1e3,1), 'pred', round(r['step_time_predicted']*1e3,1), '%+.1f%%'%(100*r['time_error']),
      'GiB', round(r['peak_mem_real']/2**30,2), round(r['peak_mem_predicted']/2**30,2),
      'kinds real', {k: round(v*1e3,1) for k, v in (r['kernel_seconds_real'] or {}).items()},
      'pred', {k: round(v*1e3,1) for k, v in r['kernel_seconds_predicted'].items()}, 'clocks', r['clocks_real'])" "$f"; done
