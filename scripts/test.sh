#!/usr/bin/env bash
# Builds moe-mlir (setting the machine up first) and runs every test: the lit
# suite under test/ (dialect, conversions, CPU execution, tools). The last line
# is "N passed, N failed"; the exit status is non-zero on any failure.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
if ! "$root/scripts/build.sh"; then
  echo "build failed"
  echo "0 passed, 1 failed"
  exit 1
fi
results="$build/test-results.xml"
rm -f "$results"
# Each test stops after MOE_TEST_TIMEOUT seconds (lit's per-test timeout,
# with Debian's python3-psutil): a hang fails that test, not the run.
/usr/lib/llvm-22/bin/lit -s -v -j"${MOE_JOBS:-2}" --timeout="${MOE_TEST_TIMEOUT:-600}" \
  --xunit-xml-output="$results" "$build/test"
lit_status=$?
"$root/.venv/bin/python" - "$results" "$lit_status" <<'PY'
import sys, xml.etree.ElementTree as ET
path, status = sys.argv[1], int(sys.argv[2])
passed = failed = 0
try:
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = case.find("failure") is not None or case.find("error") is not None \
              or case.find("skipped") is not None
        failed += bad
        passed += not bad
except (OSError, ET.ParseError) as err:
    print(f"could not read lit results: {err}")
    failed += 1
if status != 0 and failed == 0:
    failed = 1  # lit itself failed (e.g. a broken configuration)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
