"""What the Python tests share: one line per check, a summary, the exit code;
and the training tests' model and data.

    from checks import check, finish
    check(value == expected, "what is checked")
    finish()            # prints "N/M checks passed", exits 1 on any failure

    PROTEIN_CONFIG      examples/protein-moe/config.json
    PROTEIN_DATA        --data arguments: three Pfam files of Debian's
                        hmmer-examples
"""
import os
import sys

PROTEIN_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                              "examples", "protein-moe", "config.json")
_tutorial = "/usr/share/doc/hmmer/examples/tutorial"
PROTEIN_DATA = ["--data", f"{_tutorial}/Pkinase.sto", "--data", f"{_tutorial}/fn3.sto",
                "--data", f"{_tutorial}/globins45.fa"]

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
