#!/usr/bin/env bash
# Fuzzes moe-mlir with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer, in ./build-fuzz (scripts/build.sh --sanitized):
#
#   moe-ir-fuzzer      parse + verify + print/reparse + one of 40 pass
#                      pipelines (every moe pass, the train, CPU and GPU
#                      pipelines) on mutated MLIR
#   moe-reader-fuzzer  the config.json, safetensors and FASTA/Stockholm
#                      readers on mutated files
#
#   scripts/fuzz.sh [SECONDS]   # each fuzzer SECONDS (default 60) on one core
#
# The corpora start from the test tree's IR and inputs and grow in
# build-fuzz/corpus/ across runs. A crash stops that fuzzer with a report;
# the input is kept in build-fuzz/findings/ (add it to test/Fuzz/Inputs once
# fixed). Exit status: non-zero when a fuzzer found something. The test
# command runs this for a short time; run it for 30 minutes
# (scripts/fuzz.sh 900) before a release.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
case "$seconds" in
  ''|*[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2 ;;
esac
build="$root/build-fuzz"
"$root/scripts/build.sh" --sanitized || exit 1
corpus="$build/corpus"
findings="$build/findings"
mkdir -p "$corpus/ir" "$corpus/readers" "$findings"
"$root/.venv/bin/python" "$root/scripts/fuzz-seeds.py" "$root" "$corpus" || exit 1

# Leaks are not findings (MLIR keeps process-lifetime state). LLVM's
# allocators poison and unpoison their slabs in inline code, which our
# instrumented objects and the uninstrumented libMLIR.so both run: user
# poisoning is off, or libMLIR's accesses to memory our copy poisoned are
# reported (use-after-poison in RankedTensorType::get).
export ASAN_OPTIONS=detect_leaks=0:allow_user_poisoning=0:abort_on_error=1:symbolize=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
for fuzzer in moe-ir-fuzzer moe-reader-fuzzer; do
  dir=ir; [ "$fuzzer" = moe-reader-fuzzer ] && dir=readers
  log="$build/$fuzzer.log"
  echo "fuzz: $fuzzer for ${seconds}s (corpus $corpus/$dir, log $log)"
  "$build/bin/$fuzzer" -max_total_time="$seconds" -timeout=60 -rss_limit_mb=4096 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$findings/$fuzzer-" \
    "$corpus/$dir" >"$log" 2>&1
  rc=$?
  grep -E "^(stat::number_of_executed_units|stat::new_units_added)" "$log" | sed 's/^/  /'
  if [ $rc -ne 0 ]; then
    status=1
    echo "fuzz: $fuzzer found a problem (exit $rc):"
    grep -E "ERROR|SUMMARY|Test unit written|runtime error|==[0-9]+==" "$log" | head -n 20
  fi
done
exit $status
