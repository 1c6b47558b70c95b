# REQUIRES: mpi
# RUN: %python %s %t | FileCheck %s
#
# An expert-parallel layer (moe-compile'd after -moe-expert-parallel) whose
# ranks fail: nothing hangs. A rank that dies at a collective ends the job
# (mpirun sees it exit); a rank that stalls makes the others give up after
# MOERT_COMM_TIMEOUT seconds with a message naming it and the collective,
# then MPI_Abort ends every rank. Each run must end well within the bound;
# the elapsed time is checked here, not just the message. Bad launches and a
# layer that cannot be split over the ranks are errors saying why.
import os
import re
import subprocess
import sys
import time

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
MPIRUN = os.environ["MOE_MPIRUN"].split()  # from lit.cfg.py

LAYER = """
func.func @layer(%x: tensor<16x32xf32>, %logits: tensor<16x8xf32>,
                 %w1: tensor<8x32x64xf32>, %w2: tensor<8x32x32xf32>) -> tensor<16x32xf32> {
  %idx, %w = moe.router %logits top_k(2) softmax norm_topk_prob
      : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8)
      : tensor<16x32xf32>, tensor<16x2xi32> -> tensor<32x32xf32>, tensor<9xi32>, tensor<8xi32>, tensor<16x2xi32>
  %h = moe.grouped_matmul %s, %w1, %o : tensor<32x32xf32>, tensor<8x32x64xf32>, tensor<9xi32> -> tensor<32x64xf32>
  %a = moe.swiglu %h : tensor<32x64xf32> -> tensor<32x32xf32>
  %y = moe.grouped_matmul %a, %w2, %o : tensor<32x32xf32>, tensor<8x32x32xf32>, tensor<9xi32> -> tensor<32x32xf32>
  %out = moe.combine %y, %w, %p : tensor<32x32xf32>, tensor<16x2xf32>, tensor<16x2xi32> -> tensor<16x32xf32>
  return %out : tensor<16x32xf32>
}
"""


def run(cmd, stdin=None, env=None):
    full = dict(os.environ, **(env or {}))
    start = time.monotonic()
    out = subprocess.run(cmd, input=stdin, text=True, capture_output=True, env=full,
                         timeout=300)
    return out, time.monotonic() - start


def build(ranks):
    path = os.path.join(out_dir, f"layer.ep{ranks}.so")
    if ranks == 1:
        source = LAYER
    else:
        opt, _ = run(["moe-opt", f"--moe-expert-parallel=ep-size={ranks}"], LAYER)
        assert opt.returncode == 0, opt.stderr
        source = opt.stdout
    with open(path + ".mlir", "w") as f:
        f.write(source)
    out, _ = run(["moe-compile", path + ".mlir", "-o", path])
    assert out.returncode == 0, out.stderr
    return path


single, ep = build(1), {n: build(n) for n in (2, 4)}


def job(label, ranks, env, bound, artifact=None, pattern=r"^moert: .*$", mpi_args=()):
    """Runs the check on `ranks` ranks; prints the exit status, whether it
    ended within `bound` seconds, and the moert messages (sorted)."""
    out, took = run(MPIRUN + [*mpi_args, "-np", str(ranks), "moert-ep-check", single,
                              artifact or ep[ranks]], env=env)
    lines = sorted(set(re.findall(pattern, out.stderr + out.stdout, re.M)))
    print(f"{label}: exit {'non-zero' if out.returncode else 0}, "
          f"{'within' if took < bound else 'AFTER'} {bound} s")
    for l in lines:
        print("  " + l)


# A rank that dies at the first exchange: mpirun ends the job at once.
# CHECK-LABEL: dies-2: exit non-zero, within 60 s
# CHECK: moert: rank 1: MOERT_TEST_FAIL_RANK: exiting at all_to_all #1 (f32 rows)
job("dies-2", 2, {"MOERT_TEST_FAIL_RANK": "1"}, 60)
# CHECK-LABEL: dies-4: exit non-zero, within 60 s
# CHECK: moert: rank 3: MOERT_TEST_FAIL_RANK: exiting at all_to_all #2 (f32 rows)
job("dies-4", 4, {"MOERT_TEST_FAIL_RANK": "3", "MOERT_TEST_FAULT_AT": "2"}, 60)
# A launcher that does not end the job when a rank dies: the others notice
# by themselves after MOERT_COMM_TIMEOUT and name the dead rank.
# CHECK-LABEL: dies-launcher-waits: exit non-zero, within 90 s
# (The messages print sorted, so whether the timeout's line comes before or
# after the dead rank's depends on which rank times out first.)
# CHECK-DAG: moert: rank {{[023]}}: all_to_all #1 (f32 rows): timed out after 10 s (MOERT_COMM_TIMEOUT) waiting for rank 1 (counts)
# CHECK-DAG: moert: rank 1: MOERT_TEST_FAIL_RANK: exiting at all_to_all #1 (f32 rows)
job("dies-launcher-waits", 4, {"MOERT_TEST_FAIL_RANK": "1", "MOERT_COMM_TIMEOUT": "10"}, 90,
    mpi_args=("--mca", "orte_abort_on_non_zero_status", "0"))

# A rank that stalls (sleeps an hour) at the first exchange: the others wait
# 10 s (long enough that a healthy rank slowed by a loaded machine is not
# mistaken for the stalled one), name it, and abort the job.
# CHECK-LABEL: stalls-2: exit non-zero, within 90 s
# CHECK: moert: rank 0: all_to_all #1 (f32 rows): timed out after 10 s (MOERT_COMM_TIMEOUT) waiting for rank 1 (counts): that rank failed or stalls; aborting the job
# CHECK: moert: rank 1: MOERT_TEST_STALL_RANK: sleeping 3600 s at all_to_all #1 (f32 rows)
job("stalls-2", 2, {"MOERT_TEST_STALL_RANK": "1", "MOERT_COMM_TIMEOUT": "10"}, 90)
# On the way back (the second all_to_all), 4 ranks; whichever rank times out
# first names rank 2.
# CHECK-LABEL: stalls-4: exit non-zero, within 90 s
# CHECK-DAG: moert: rank {{[013]}}: all_to_all #2 (f32 rows): timed out after 10 s (MOERT_COMM_TIMEOUT) waiting for rank 2 (counts)
# CHECK-DAG: moert: rank 2: MOERT_TEST_STALL_RANK: sleeping 3600 s at all_to_all #2 (f32 rows)
job("stalls-4", 4, {"MOERT_TEST_STALL_RANK": "2", "MOERT_TEST_FAULT_AT": "2",
                    "MOERT_COMM_TIMEOUT": "10"}, 90)

# Launches that do not fit the program.
# CHECK-LABEL: world-size-3-on-2: exit non-zero
# CHECK: WORLD_SIZE=3 disagrees with MPI: the launcher started 2 processes
job("world-size-3-on-2", 2, {"WORLD_SIZE": "3"}, 60)
# CHECK-LABEL: ep2-on-4: exit non-zero
# CHECK: moert-ep-check: @layer was compiled for 2 ranks (ep-size), but 4 were launched
job("ep2-on-4", 4, {}, 60, artifact=ep[2])
out, _ = run(["moert-ep-check", single, ep[2]], env={"WORLD_SIZE": "2"})
# CHECK: no-rank: moert: error: RANK is not set, but WORLD_SIZE=2 is: set RANK to this process's rank (0..1)
print("no-rank:", out.stderr.strip())

# 8 experts cannot be split over 3 ranks: moe-opt says so.
# CHECK: ep-size-3: error: moe-expert-parallel: the 8 experts do not divide evenly over ep-size=3
opt, _ = run(["moe-opt", "--moe-expert-parallel=ep-size=3"], LAYER)
print("ep-size-3:", re.search(r"error: .*", opt.stderr).group(0) if opt.returncode else "no error")
