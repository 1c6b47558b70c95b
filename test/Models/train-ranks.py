# REQUIRES: mpi
# RUN: %python %s %t
#
# moe-train --ep-size N on N CPU ranks (MPI), the small protein model of
# examples/protein-moe:
# - 2 ranks of 2 rows and 4 ranks of 1 row train as one rank of 4 rows: the
#   same losses, held-out losses and gradient norms within 1e-5 relative
#   (the sums over tokens and experts run in another order), the expert
#   load of each evaluation exactly, the merged checkpoint within 1e-5;
# - resume on 2 ranks is exact (stop, resume: the same files, byte for
#   byte, and the same metric lines), and a checkpoint of 2 ranks resumes
#   on 1 and on 4 ranks (the same rows a step);
# - a rank killed (SIGKILL) mid-run ends the job at once, and one that
#   stalls ends it within MOERT_COMM_TIMEOUT; the index names the last
#   complete checkpoint, which resumes exactly (the same bytes as a run
#   that was never interrupted);
# - layer functions (--layer-functions, with --recompute) on 2 and 2 x 2
#   ranks train as one rank, and so does the blockwise FP8 recipe on 2
#   (also with the LM head and loss in chunks, --loss-chunk-rows);
# - data parallelism: 2 copies of 2 expert-parallel ranks (--dp-size 2
#   --ep-size 2) and 2 data-parallel ranks (--dp-size 2) train as one rank
#   too; the first expert-parallel group writes the checkpoint, which
#   resumes on another layout with the same rows a step; a launch of the
#   wrong number of ranks is refused; a killed rank of 4 stops the job;
# - export_hf merges the ranks' files;
# - bad launches and options are refused, saying why.
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from checks import PROTEIN_CONFIG, PROTEIN_DATA, check, finish
from moe_mlir import hf
from moe_mlir.models import _read_checkpoint, export_hf

out = sys.argv[1]
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
config, data = PROTEIN_CONFIG, PROTEIN_DATA
MPIRUN = os.environ["MOE_MPIRUN"]  # from lit.cfg.py
opts = ["--eval-every", "3", "--checkpoint-every", "3", "--progress", "none"]


def run(cmd, expect=0, env=None, timeout=600):
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    r.seconds = time.monotonic() - start
    if expect is not None and r.returncode != expect:
        print(" ".join(cmd), "\n", r.stdout, r.stderr)
    return r


def compile_step(name, batch, ranks, dp=1):
    d = os.path.join(out, name)
    r = run(["moe-train", "--config", config, "--batch", str(batch), "--seq", "32",
             "--ep-size", str(ranks), "--dp-size", str(dp), "--compile-only", "--out", d])
    return os.path.join(d, "train_step-cpu" + ("-dp%d" % dp if dp > 1 else "") +
                        ("-ep%d" % ranks if ranks > 1 else "") + ".so")


def moert(ranks, artifact, d, *args, expect=0, env=None):
    launch = MPIRUN.split() + ["-np", str(ranks)] if ranks > 1 else []
    return run(launch + ["moert-train", artifact, *data, *opts, "--out", d, *args],
               expect=expect, env=env)


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def close(a, b, bound=1e-5):
    return abs(a - b) <= bound * max(abs(a), abs(b), 1e-30)


def same_run(d, ref, bound=1e-5):
    """The metrics of run `d` against `ref`: losses, held-out losses and
    norms within `bound` relative, expert loads exact."""
    a, b = metrics(d), metrics(ref)
    if [m["step"] for m in a] != [m["step"] for m in b]:
        return False
    for x, y in zip(a, b):
        for key in ("loss", "held_out_loss", "grad_norm"):
            if (key in x) != (key in y) or (key in x and not close(x[key], y[key], bound)):
                print(f"step {x['step']}: {key} {x.get(key)} vs {y.get(key)}")
                return False
        if x.get("expert_load") != y.get("expert_load"):
            print(f"step {x['step']}: expert load {x.get('expert_load')} vs {y.get('expert_load')}")
            return False
    return True


def files(d):
    """{name: bytes} of a run's checkpoint files."""
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))
            if n.startswith("checkpoint")}


def index_step(d):
    with open(os.path.join(d, "checkpoint.index.json")) as f:
        return json.load(f)["step"]


one = compile_step("one", 4, 1)
ep2 = compile_step("ep2", 2, 2)
ep4 = compile_step("ep4", 1, 4)

# --- N ranks train as one rank with N times the rows ---
ref = os.path.join(out, "ref")
moert(1, one, ref, "--steps", "6")
for ranks, artifact in ((2, ep2), (4, ep4)):
    d = os.path.join(out, f"run{ranks}")
    r = moert(ranks, artifact, d, "--steps", "6")
    check(r.returncode == 0 and same_run(d, ref),
          f"{ranks} ranks: the losses, norms and expert loads of one rank")
    check(sorted(n for n in os.listdir(d) if n.startswith("checkpoint")) ==
          ["checkpoint-00000006-%05d-of-%05d.safetensors" % (i + 1, ranks) for i in range(ranks)] +
          ["checkpoint.index.json"], f"{ranks} ranks: one file per rank and the index")
    a, _ = _read_checkpoint(os.path.join(ref, "checkpoint.safetensors"))
    b, meta = _read_checkpoint(os.path.join(d, "checkpoint.index.json"))
    check(a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a) and
          all(np.linalg.norm(a[k] - b[k]) <= 1e-5 * max(np.linalg.norm(a[k]), 1e-30) for k in a)
          and meta["batch"] == "4",
          f"{ranks} ranks: the merged checkpoint is one rank's")
    check(r.stderr.count("parameter tensors") == 1 and r.stderr.count("wrote") == 1 and f"{ranks} ranks (--ep-size {ranks})" in r.stderr,
          f"{ranks} ranks: the first rank speaks")

# --- data parallelism: copies of the expert-parallel group ---
dp2ep2 = compile_step("dp2ep2", 1, 2, dp=2)
dp2 = compile_step("dp2", 2, 1, dp=2)
for name, ranks, artifact, written in (
        ("dp2ep2", 4, dp2ep2, ["checkpoint-00000006-00001-of-00002.safetensors",
                               "checkpoint-00000006-00002-of-00002.safetensors",
                               "checkpoint.index.json"]),
        ("dp2", 2, dp2, ["checkpoint.safetensors"])):
    d = os.path.join(out, "run-" + name)
    r = moert(ranks, artifact, d, "--steps", "6")
    check(r.returncode == 0 and same_run(d, ref),
          f"{name} on {ranks} ranks: the losses, norms and expert loads of one rank")
    check(sorted(n for n in os.listdir(d) if n.startswith("checkpoint")) == written,
          f"{name}: the first expert-parallel group writes the checkpoint")
    b, meta = _read_checkpoint(os.path.join(d, written[-1]))
    check(all(np.linalg.norm(a[k] - b[k]) <= 1e-5 * max(np.linalg.norm(a[k]), 1e-30) for k in a)
          and meta["batch"] == "4", f"{name}: the checkpoint is one rank's")
check("2 x 2 ranks (--dp-size 2 --ep-size 2)" in moert(4, dp2ep2, os.path.join(out, "dp-say"), "--steps", "1").stderr,
      "2 x 2 ranks: the first rank names the layout")
d = os.path.join(out, "dp-to-ep")
moert(4, dp2ep2, d, "--steps", "6", "--stop-after-steps", "3")
r = moert(2, ep2, d, "--steps", "6", "--resume")
check(r.returncode == 0 and same_run(d, ref), "a checkpoint of 2 x 2 ranks resumes on 2 expert-parallel ranks")
d = os.path.join(out, "ep-to-dp")
moert(2, ep2, d, "--steps", "6", "--stop-after-steps", "3")
r = moert(2, dp2, d, "--steps", "6", "--resume")
check(r.returncode == 0 and same_run(d, ref), "a checkpoint of 2 expert-parallel ranks resumes on 2 data-parallel ranks")
r = moert(2, dp2ep2, os.path.join(out, "dp-wrong"), "--steps", "1", expect=None)
check(r.returncode != 0 and "was compiled for 2 x 2 ranks (--dp-size 2 --ep-size 2), but 2 were launched "
      "(launch 4, e.g. mpirun -np 4)" in r.stderr, "2 x 2 ranks launched as 2: refused")
d = os.path.join(out, "dp-killed")
r = moert(4, dp2ep2, d, "--steps", "6", env={"MOERT_TEST_FAIL_RANK": "3", "MOERT_TEST_FAULT_AT": "40"},
          expect=None)
check(r.returncode != 0 and "rank 3: MOERT_TEST_FAIL_RANK: exiting" in r.stderr and r.seconds < 120,
      "2 x 2 ranks: a rank that dies stops the job")
d = os.path.join(out, "dp-launched")
r = run(["moe-train", "--config", config, *data, "--batch", "1", "--seq", "32", "--ep-size", "2",
         "--dp-size", "2", "--launcher", MPIRUN + " -np 4", *opts, "--steps", "6", "--out", d])
check(r.returncode == 0 and same_run(d, os.path.join(out, "run-dp2ep2"), 0),
      "moe-train --dp-size 2 --ep-size 2 --launcher: the same run as moert-train under mpirun")

# --- the blockwise FP8 recipe: each rank quantizes its experts' weight tiles
# (128 x 128 per expert, so a shard's tiles are the whole tensor's) ---
fb = {}
for name, batch, ranks in (("fb-one", 4, 1), ("fb-ep2", 2, 2)):
    d = os.path.join(out, name)
    run(["moe-train", "--config", config, "--batch", str(batch), "--seq", "32",
         "--ep-size", str(ranks), "--recipe", "fp8-blockwise", "--compile-only", "--out", d])
    fb[name] = os.path.join(d, "train_step-cpu-fp8-blockwise" + ("-ep2" if ranks > 1 else "") + ".so")
    moert(ranks, fb[name], os.path.join(out, "run-" + name), "--steps", "6")
check(same_run(os.path.join(out, "run-fb-ep2"), os.path.join(out, "run-fb-one")),
      "--recipe fp8-blockwise: 2 ranks train as one rank")
# The LM head and loss in chunks (--loss-chunk-rows): each rank's 64 tokens
# as 48 and 16, the loss scaled by the rank's share after the chunks.
model = os.path.join(out, "model-2x32.mlir")
run(["moe-model", config, "--batch", "2", "--seq", "32", "-o", model])
ir = run(["moe-opt", model, "--moe-train-pipeline=recipe=fp8-blockwise autodiff=true ep-size=2 "
          "loss-chunk-rows=48 optimizer=adamw"]).stdout
step = ir[ir.index("@loss_step"):]
chunks = [int(m.split("tensor<")[1].split("x")[0]) for m in step.split("moe.cross_entropy ")[1:]]
check(chunks == [48, 16], f"2 ranks: each rank's loss in chunks of {chunks} rows")
d = os.path.join(out, "fb-ep2-lc")
r = run(["moe-train", "--config", config, "--batch", "2", "--seq", "32", "--ep-size", "2",
     "--recipe", "fp8-blockwise", "--loss-chunk-rows", "48", "--compile-only", "--out", d])
moert(2, os.path.join(d, "train_step-cpu-fp8-blockwise-ep2.so"), os.path.join(out, "run-fb-lc"),
      "--steps", "6")
check("not chunked" not in r.stderr and
      same_run(os.path.join(out, "run-fb-lc"), os.path.join(out, "run-fb-one")),
      "--loss-chunk-rows 48 on 2 ranks trains as one rank")

# --- layer functions: the layers' expert weights sharded through the calls ---
for name, ranks, args in (("lf-ep2", 2, ["--ep-size", "2", "--batch", "2", "--recompute"]),
                          ("lf-dp2ep2", 4, ["--ep-size", "2", "--dp-size", "2", "--batch", "1"])):
    d = os.path.join(out, name)
    r = run(["moe-train", "--config", config, *data, "--seq", "32", "--layer-functions", *args,
             "--launcher", MPIRUN + " -np %d" % ranks, *opts, "--steps", "6", "--out", d])
    check(r.returncode == 0 and same_run(d, ref), f"--layer-functions {' '.join(args)}: one rank's run")

# --- the gradient sums in buckets or one by one; exchanges in chunks ---
d = os.path.join(out, "unbucketed")
r = run(["moe-train", "--config", config, *data, "--batch", "2", "--seq", "32", "--ep-size", "2",
         "--grad-bucket-mib", "0", "--launcher", MPIRUN + " -np 2", *opts, "--steps", "6", "--out", d])
check(r.returncode == 0 and same_run(d, os.path.join(out, "run2"), 0),
      "--grad-bucket-mib 0 (one sum per gradient): the bucketed run, exactly")
d = os.path.join(out, "chunks")
r = run(["moe-train", "--config", config, *data, "--batch", "2", "--seq", "32", "--ep-size", "2",
         "--ep-chunks", "2", "--launcher", MPIRUN + " -np 2", *opts, "--steps", "6", "--out", d])
check(r.returncode == 0 and same_run(d, ref), "--ep-chunks 2: one rank's run")

# --- moe-train --ep-size launches the ranks itself ---
d = os.path.join(out, "launched")
r = run(["moe-train", "--config", config, *data, "--batch", "2", "--seq", "32", "--ep-size", "2", "--launcher",
         MPIRUN + " -np 2", *opts, "--steps", "6", "--out", d])
check(r.returncode == 0 and same_run(d, os.path.join(out, "run2"), 0),
      "moe-train --ep-size 2 --launcher: the same run as moert-train under mpirun")

# --- resume ---
d = os.path.join(out, "resumed2")
moert(2, ep2, d, "--steps", "6", "--stop-after-steps", "2")
r = moert(2, ep2, d, "--steps", "6", "--resume")
check(files(d) == files(os.path.join(out, "run2")) and
      [{k: v for k, v in m.items() if k not in ("time", "tokens_per_s", "tflops", "memory_mib",
                                                      "memory_reserved_mib")}
       for m in metrics(d)] ==
      [{k: v for k, v in m.items() if k not in ("time", "tokens_per_s", "tflops", "memory_mib",
                                                      "memory_reserved_mib")}
       for m in metrics(os.path.join(out, "run2"))],
      "2 ranks: stop at 2, resume to 6: the same checkpoint bytes and metrics")
for ranks, artifact in ((1, one), (4, ep4)):
    d = os.path.join(out, f"2to{ranks}")
    moert(2, ep2, d, "--steps", "6", "--stop-after-steps", "2")
    r = moert(ranks, artifact, d, "--steps", "6", "--resume")
    check(r.returncode == 0 and same_run(d, ref) and
          os.path.exists(os.path.join(d, "checkpoint.safetensors" if ranks == 1
                                      else "checkpoint.index.json")) and
          not (ranks == 1 and os.path.exists(os.path.join(d, "checkpoint.index.json"))),
          f"a checkpoint of 2 ranks resumes on {ranks}")
d = os.path.join(out, "other-batch")
moert(2, ep2, d, "--steps", "6", "--stop-after-steps", "2")
r = moert(2, compile_step("ep2b1", 1, 2), d, "--steps", "6", "--resume", expect=None)
check(r.returncode != 0 and "made with batch '4', this run has '2'" in r.stderr,
      "resuming with other rows a step is refused")

d = os.path.join(out, "kept")
moert(2, ep2, d, "--steps", "6", "--keep-checkpoints", "2")
check(sorted(n for n in os.listdir(d) if n.startswith("checkpoint")) ==
      ["checkpoint-00000003-00001-of-00002.safetensors",
       "checkpoint-00000003-00002-of-00002.safetensors", "checkpoint-00000003.index.json",
       "checkpoint-00000006-00001-of-00002.safetensors",
       "checkpoint-00000006-00002-of-00002.safetensors", "checkpoint-00000006.index.json",
       "checkpoint.index.json"], "--keep-checkpoints 2 on 2 ranks: two indices and their files")

# A bad index: refused, naming it, nothing written.
index = os.path.join(out, "run2", "checkpoint.index.json")
good = open(index).read()
for text, message in (
        ('{"format": 1, "step": 6, "files": ["a"]}', "not a moe-train checkpoint index"),
        ("{", "not JSON"),
        (json.dumps({"format": "moe-train-index/1", "step": 6, "files": [
            "checkpoint-00000006-00002-of-00002.safetensors",
            "checkpoint-00000006-00001-of-00002.safetensors"]}),
         "is shard '2 of 2', its place in"),
        (json.dumps({"format": "moe-train-index/1", "step": 3, "files": [
            "checkpoint-00000006-00001-of-00002.safetensors",
            "checkpoint-00000006-00002-of-00002.safetensors"]}),
         "(files of another checkpoint)"),
        (json.dumps({"format": "moe-train-index/1", "step": 6, "files": ["../x"]}),
         "names of distinct files beside the index")):
    with open(index, "w") as f:
        f.write(text)
    before = files(os.path.join(out, "run2"))
    r = moert(2, ep2, os.path.join(out, "run2"), "--steps", "9", "--resume", expect=None)
    check(r.returncode != 0 and message in r.stderr and
          files(os.path.join(out, "run2")) == before, f"a bad index: '{message}'")
with open(index, "w") as f:
    f.write(good)
# A byte of the second rank's file flipped: its rank reads it and says so.
shard = os.path.join(out, "run2", "checkpoint-00000006-00002-of-00002.safetensors")
blob = bytearray(open(shard, "rb").read())
blob[-5] ^= 0x40
open(shard, "wb").write(bytes(blob))
r = moert(2, ep2, os.path.join(out, "run2"), "--steps", "9", "--resume", expect=None)
check(r.returncode != 0 and "rank 1: " + shard + ": the data do not match the checksum" in r.stderr,
      "a corrupt rank file is found by the rank that reads it")
blob[-5] ^= 0x40
open(shard, "wb").write(bytes(blob))

# --- faults: the last complete checkpoint survives, and resumes exactly ---
long = ["--steps", "400", "--checkpoint-every", "2", "--eval-every", "0"]


def rank_pid(ranks_parent, rank):
    """The pid of the moert-train process of MPI rank `rank` under mpirun."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if (b"moert-train" in cmd.split(b"\0")[0] and
                f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and
                f"MOE_TEST_RUN={ranks_parent}".encode() in env):
            return int(pid)
    return None


def resumes_exactly(d, label):
    """The index's checkpoint, resumed for 2 steps, equals a run that was
    never interrupted, stopped at the same step."""
    step = index_step(d)
    r = moert(2, ep2, d, *long, "--resume", "--stop-after-steps", "2")
    ref = os.path.join(out, f"{label}-ref")
    moert(2, ep2, ref, *long, "--stop-after-steps", str(step + 2))
    check(r.returncode == 0 and step >= 2 and files(d) == files(ref),
          f"{label}: the index names a complete checkpoint (step {step}), which resumes exactly")


d = os.path.join(out, "killed")
os.makedirs(d)
launch = MPIRUN.split() + ["-np", "2", "moert-train", ep2, *data, *opts, *long, "--out", d]
job = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=dict(os.environ, MOE_TEST_RUN="killed"))
killed = None
deadline = time.monotonic() + 120
while time.monotonic() < deadline and job.poll() is None and killed is None:
    if os.path.exists(os.path.join(d, "checkpoint.index.json")) and index_step(d) >= 4:
        pid = rank_pid("killed", 1)
        if pid:
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
    time.sleep(0.05)
job.communicate(timeout=120)
check(killed is not None and job.returncode != 0 and time.monotonic() - killed < 60,
      "a rank killed mid-run ends the job (within 60 s)")
resumes_exactly(d, "killed")

d = os.path.join(out, "stalled")
r = moert(2, ep2, d, *long, expect=None,
          env={"MOERT_TEST_STALL_RANK": "1", "MOERT_TEST_FAULT_AT": "300",
               "MOERT_COMM_TIMEOUT": "5"})
check(r.returncode != 0 and r.seconds < 60 and "MOERT_COMM_TIMEOUT" in r.stderr,
      f"a stalled rank ends the job after the timeout ({r.seconds:.0f} s)")
resumes_exactly(d, "stalled")

# --- export_hf merges the ranks' files ---
hf1 = export_hf(ref, config, os.path.join(out, "hf1"))
hf2 = export_hf(os.path.join(out, "run2"), config, os.path.join(out, "hf2"))
a, _ = _read_checkpoint(os.path.join(hf1, "model.safetensors"))
b, _ = _read_checkpoint(os.path.join(hf2, "model.safetensors"))
check(a.keys() == b.keys() and
      all(np.abs(a[k] - b[k]).max() <= 1e-5 * max(np.abs(a[k]).max(), 1e-30) for k in a),
      "export_hf of 2 ranks' checkpoint: one rank's model")

# --- --init-from on ranks: each reads its experts only ---
fused = os.path.join(out, "fused")
os.makedirs(fused)
shutil.copy(config, fused)
t, meta = _read_checkpoint(os.path.join(ref, "checkpoint.safetensors"))
swapped = set(meta["hf_transposed"].split(","))
hf.write_safetensors(os.path.join(fused, "model.safetensors"),
                     {k: np.swapaxes(v, -1, -2) if k in swapped else v for k, v in t.items()
                      if not k.startswith(("optimizer.", "router."))})
for layout, source in (("per-expert tensors", hf1), ("fused experts", fused)):
    d1, d2 = os.path.join(out, f"init1-{layout[:5]}"), os.path.join(out, f"init2-{layout[:5]}")
    moert(1, one, d1, "--steps", "3", "--init-from", source)
    r = moert(2, ep2, d2, "--steps", "3", "--init-from", source)
    check(r.returncode == 0 and same_run(d2, d1), f"--init-from ({layout}) on 2 ranks: one rank's run")
    d4 = os.path.join(out, f"init4-{layout[:5]}")
    r = moert(4, dp2ep2, d4, "--steps", "3", "--init-from", source)
    check(r.returncode == 0 and same_run(d4, d1), f"--init-from ({layout}) on 2 x 2 ranks: one rank's run")

# --- bad launches and options ---
r = moert(2, one, os.path.join(out, "bad1"), "--steps", "2", expect=None)
check(r.returncode != 0 and "compiled for 1 rank, but 2 were launched" in r.stderr and
      "moe-train --ep-size or --dp-size" in r.stderr, "a one-rank step on 2 ranks is refused")
r = moert(2, ep4, os.path.join(out, "bad2"), "--steps", "2", expect=None)
check(r.returncode != 0 and "compiled for 4 ranks (--ep-size 4), but 2 were launched" in r.stderr,
      "a 4-rank step on 2 ranks is refused")
r = run(["moe-train", "--config", config, *data, "--ep-size", "3", "--out",
         os.path.join(out, "bad3")], expect=1)
check("--ep-size 3 must divide the 8 experts" in r.stderr, "--ep-size not dividing the experts")
r = run(["moe-train", "--config", config, *data, "--launcher", "mpirun", "--out",
         os.path.join(out, "bad4")], expect=1)
check("--launcher starts the ranks of --ep-size N > 1" in r.stderr, "--launcher without --ep-size")
r = run(["moe-train", "--config", config, *data, "--ep-size", "2", "--out",
         os.path.join(out, "bad5")], expect=1, env={"OMPI_COMM_WORLD_SIZE": "2"})
check("run moe-train once" in r.stderr, "moe-train under a launcher is refused")
r = run(["moe-train", "--config", config, "--ep-size", "2", "--launcher", "mpirun",
         "--compile-only", "--out", os.path.join(out, "bad7")], expect=1)
check("nothing is launched" in r.stderr, "--launcher with --compile-only")
r = run(["moe-train", "--config", config, *data, "--ep-size", "2", "--launcher",
         "no-such-launcher -n 2", "--out", os.path.join(out, "bad6")], expect=1)
check("cannot run no-such-launcher" in r.stderr, "a launcher that does not exist")
r = run(["moe-train", "--config", config, *data, "--ep-chunks", "2", "--out",
         os.path.join(out, "bad8")], expect=1)
check("--ep-chunks splits the exchanges of --ep-size N > 1" in r.stderr, "--ep-chunks without --ep-size")
r = run(["moe-train", "--config", config, *data, "--batch", "1", "--seq", "30", "--ep-size", "2",
         "--ep-chunks", "4", "--out", os.path.join(out, "bad9")], expect=1)
check("--ep-chunks 4 must divide the 30 tokens" in r.stderr, "--ep-chunks not dividing the tokens")
r = run(["moe-train", "--config", config, *data, "--ep-size", "2", "--grad-bucket-mib", "-1",
         "--out", os.path.join(out, "bad10")], expect=1)
check("--grad-bucket-mib expects a non-negative integer, got '-1'" in r.stderr, "a negative bucket size")
finish()
