#!/usr/bin/env bash
# Calibrate the local GPU and check real training steps against the prediction.
# Writes into ${OUT:-out/device}: <name>.json (system config), its .report.json, check_*.json, log.
# Used on the lent H100 (docs/calibration.md); needs torch and the simumax package importable.
# calibrate times GEMM/attention at full clock (0.3 s idle before each) and measures the power
# curve (~40 s per calibrate call); benchmarks/sustained_gemm.py, gemm_duty_cycle.py and
# power_ramp.py print the power-limit readings behind it (docs/calibration.md).
set -uo pipefail
OUT=${OUT:-out/device}
mkdir -p "$OUT"
J=benchmarks/calibration_jobs
SM="python3 -m simumax.cli"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.csv"
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z_' | tr -cd 'a-z0-9_')
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
# the kernels of common jobs (per-rank shapes of TP 1..8, MoE EP, MLA) and of the check-step jobs
$SM calibrate --name "$NAME" --out "$OUT/$NAME.json" \
  -m llama3-8b -s tp1_pp1_dp8_mbs1 -m llama3-8b -s tp2_pp1_dp4_mbs1 -m llama3-8b -s tp4_pp1_dp2_mbs1 \
  -m llama3-8b -s tp8_pp1_dp1_mbs1 -m llama3-70b -s tp4_pp1_dp2_mbs1 -m llama3-70b -s tp8_pp1_dp1_mbs1 \
  -m llama2-7b -s tp1_pp1_dp8_mbs1 -m deepseekv2 -s ep8_pp1_dp8_mbs1 -m mixtral-8x7b -s ep8_pp1_dp8_mbs1 \
  -m llama3-8b -s $J/single_seq4096_mbs1.json -m $J/llama3-1b.json -s $J/single_seq2048_mbs2.json \
  -m llama2-7b -s $J/single_seq4096_mbs1.json || exit 1
SYS="$OUT/$NAME.json"
# fp8 GEMMs as TransformerEngine runs them (split accumulation in backward), on the shapes of
# NeMo's fp8 rows (LLAMA2-7B TP1, Llama3-8B TP1/2, Llama3-70B TP4): docs/validation.md's fp8 lead
$SM calibrate --base "$SYS" --name "${NAME}_fp8" --out "$OUT/${NAME}_fp8.json" --set strategy.fp8=true --no-power-curve \
  -m llama2-7b -s tp1_pp1_dp8_mbs1 -m llama3-8b -s tp1_pp1_dp8_mbs1 -m llama3-8b -s tp2_pp1_dp4_mbs1 \
  -m llama3-70b -s tp4_pp1_dp2_mbs1 || echo "fp8 calibration failed"
$SM check-step -m llama3-8b --set layer_num=4 -y "$SYS" --seq-len 4096 --mbs 1 --mbc 2 --profile --json > "$OUT/check_llama3_8b_l4.json"
$SM check-step -m $J/llama3-1b.json -y "$SYS" --seq-len 2048 --mbs 2 --mbc 2 --json > "$OUT/check_llama3_1b.json"
$SM check-step -m llama2-7b --set layer_num=4 -y "$SYS" --seq-len 4096 --mbs 1 --mbc 2 --json > "$OUT/check_llama2_7b_l4.json"
for f in "$OUT"/check_*.json; do python3 -c "
import json,sys; r=json.load(open(sys.argv[1]))
print(r['model'], r['layers'], 'time', round(r['step_time_real']*1e3,1), round(r['step_time_predicted']*1e3,1), '%+.1f%%'%(100*r['time_error']),
      'mem', round(r['peak_mem_real']/2**30,2), round(r['peak_mem_predicted']/2**30,2), '%+.1f%%'%(100*r['mem_error']), 'misses', r['misses'], 'states', round(r['model_state_bytes_real']/2**30,2), round(r['model_state_bytes_predicted']/2**30,2), 'act', round(r['activation_bytes_real']/2**30,2), round(r['activation_bytes_predicted']/2**30,2), 'fused', r['wgrad_accumulation_fused'], 'host issue', r.get('host_issue_real'), r.get('host_issue_launches_real'), r.get('host_issue_predicted'), {k: (round(v*1e3,1), round(r['phase_time_predicted'][k]*1e3,1)) for k, v in r['phase_time_real'].items()})" "$f"; done
