"""What the Python tests share: one line per check, a summary, the exit code.

    from checks import check, finish
    check(value == expected, "what is checked")
    finish()            # prints "N/M checks passed", exits 1 on any failure
"""
import sys

_counts = {"checks": 0, "failures": 0}


def check(ok, what):
    _counts["checks"] += 1
    _counts["failures"] += not ok
    print(f"{'ok' if ok else 'FAIL'}: {what}")
    return ok


def finish():
    n, bad = _counts["checks"], _counts["failures"]
    print(f"{n - bad}/{n} checks passed")
    sys.exit(1 if bad else 0)
