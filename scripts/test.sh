#!/usr/bin/env bash
# Builds moe-mlir (setting the machine up first) and runs every test:
#   1. the lit suite under test/ (dialect, conversions, CPU execution, tools,
#      Python) on the Release build in ./build;
#   2. the same suite without the Python tests on ./build-fuzz, built with
#      AddressSanitizer and UndefinedBehaviorSanitizer (scripts/build.sh
#      --sanitized): a memory error or undefined behaviour fails the test;
#   3. a short fuzz run (scripts/fuzz.sh, MOE_FUZZ_SECONDS per fuzzer,
#      default 60; 0 skips it).
# The last line is "N passed, N failed"; the exit status is non-zero on any
# failure. MOE_SANITIZED=0 skips 2 and 3.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
fuzz_seconds=${MOE_FUZZ_SECONDS:-60}
sanitized=${MOE_SANITIZED:-1}
results=()
extra_failed=0
extra_passed=0

# Each test stops after MOE_TEST_TIMEOUT seconds (default 1200; lit's
# per-test timeout, with Debian's python3-psutil): a hang fails that test,
# not the run. The longest test, Models/train.py (22 moe-train runs of the
# protein model, each compiling it), takes about 11.5 minutes of one core.
run_lit() { # build-dir results-file
  rm -f "$2"
  /usr/lib/llvm-22/bin/lit -s -v -j"${MOE_JOBS:-2}" --timeout="${MOE_TEST_TIMEOUT:-1200}" \
    --xunit-xml-output="$2" "$1/test"
  local status=$?
  results+=("$2:$status")
}

if ! "$root/scripts/build.sh"; then
  echo "build failed"
  echo "0 passed, 1 failed"
  exit 1
fi
run_lit "$root/build" "$root/build/test-results.xml"

if [ "$sanitized" != 0 ]; then
  if "$root/scripts/build.sh" --sanitized; then
    echo "== the suite under AddressSanitizer and UndefinedBehaviorSanitizer"
    run_lit "$root/build-fuzz" "$root/build-fuzz/test-results.xml"
    if [ "$fuzz_seconds" != 0 ]; then
      echo "== fuzzing, ${fuzz_seconds}s a fuzzer"
      if "$root/scripts/fuzz.sh" "$fuzz_seconds"; then
        extra_passed=$((extra_passed + 1))
      else
        extra_failed=$((extra_failed + 1))
      fi
    fi
  else
    echo "sanitized build failed"
    extra_failed=$((extra_failed + 1))
  fi
fi

"$root/.venv/bin/python" - "$extra_passed" "$extra_failed" "${results[@]}" <<'PY'
import sys, xml.etree.ElementTree as ET
passed, failed = int(sys.argv[1]), int(sys.argv[2])
for item in sys.argv[3:]:
    path, status = item.rsplit(":", 1)
    before = failed
    try:
        for case in ET.parse(path).getroot().iter("testcase"):
            bad = case.find("failure") is not None or case.find("error") is not None \
                  or case.find("skipped") is not None
            failed += bad
            passed += not bad
    except (OSError, ET.ParseError) as err:
        print(f"could not read lit results {path}: {err}")
        failed += 1
    if int(status) != 0 and failed == before:
        failed += 1  # lit itself failed (e.g. a broken configuration)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
