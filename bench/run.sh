#!/usr/bin/env bash
# Grouped GEMM, ours beside torch's, in one GPU run. Needs the artifacts of
# `scripts/gpu-check.sh prepare` (bench/bench_*.mlir compiled) and a built
# libmoert (scripts/gpu-check.sh run builds it in $MOE_RUNTIME_BUILD).
#   bench/run.sh [results-file]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rt=${MOE_RUNTIME_BUILD:-/tmp/moert-build}
chip=${MOE_GPU_CHIP:-sm_90a}
out=${1:-/dev/stdout}
[ -x "$rt/bin/moert-check" ] || "$root/scripts/build-runtime.sh" "$rt"
rows=32768; flops=$(python3 -c "print(2.0*$rows*2048*1536)")
{
  echo "# Grouped GEMM, Qwen3-30B-A3B expert GEMM1 shapes (E=128, K=2048, N=1536)"
  echo
  echo "date: $(date -u +%Y-%m-%d), GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  echo
  echo '```'
  "$rt/bin/moert-check" --gpu-only "$root/gpu-artifacts/bench_grouped_gemm.$chip.so" --repeat 10 |
    python3 -c "
import re, sys
for line in sys.stdin:
    m = re.match(r'(\S+)\s+gpu median ([0-9.]+) ms', line)
    if m:
        ms = float(m.group(2))
        print(f'{\"moe-mlir \" + m.group(1):40s} rows=$rows {ms:9.3f} ms {$flops/ms/1e9:8.1f} TFLOP/s')
"
  python3 "$root/bench/grouped_gemm_torch.py" $rows 131072
  echo '```'
} | tee "$out"
