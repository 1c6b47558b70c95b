# RUN: %python %s %t moe-train
#
# moe-train on the CPU with the small protein model of examples/protein-moe
# and Pfam alignments from Debian's hmmer-examples:
# - the loss falls: the held-out loss ends below the unigram baseline and
#   below its first value;
# - the trained checkpoint, exported (moe_mlir.models.export_hf), loads into
#   transformers' Qwen3MoeForCausalLM and gives the same loss;
# - resume is exact: 12 steps, stop, resume to 24 give the same losses and
#   the same checkpoint bytes as 24 steps in one run;
# - the MXFP8 recipe trains, its losses close to f32's;
# - a kill (SIGKILL) while checkpoints are being written leaves a complete
#   checkpoint that resumes;
# - --document-mask (attention within each packed sequence) trains;
# - bad input: a truncated or corrupted checkpoint, a checkpoint of another
#   config or another run, an existing checkpoint without --resume, empty or
#   malformed sequence files, unknown residues, a vocabulary too small for
#   the tokenizer: clear errors, exit 1, nothing overwritten.
import json
import re
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import torch
from transformers import Qwen3MoeForCausalLM

from checks import PROTEIN_CONFIG, PROTEIN_DATA, check, finish
from moe_mlir.models import LanguageModel, export_hf

out, tool = sys.argv[1], sys.argv[2]
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
config, data = PROTEIN_CONFIG, PROTEIN_DATA


def train(*args, cfg=config, expect=0):
    r = subprocess.run([tool, "--config", cfg, *data, "--progress", "none", *args],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != expect:
        print(r.stdout, r.stderr)
    return r


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def losses(d):
    return [(m["step"], m.get("loss"), m.get("held_out_loss")) for m in metrics(d)]


def checkpoint_ok(path):
    """A structurally complete safetensors file (header and every tensor)."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    return len(blob) == 8 + n + end


common = ["--batch", "8", "--seq", "64", "--eval-every", "30", "--eval-batches", "0"]

# --- the loss falls ---
a = os.path.join(out, "a")
r = train(*common, "--steps", "90", "--out", a)
check(r.returncode == 0, "trains 90 steps")
# Every --data file's sequences are trained on (once only the last file's):
# each sequence is <bos> residues <eos>, all of them cut into rows of
# seq + 1 tokens (moert-seq-info counts the residues).
tokens = 0
for path in data[1::2]:
    info = subprocess.run([os.path.join(os.path.dirname(tool), "moert-seq-info"), path, "protein"],
                          capture_output=True, text=True, timeout=60).stdout
    counts = dict(line.split(": ") for line in info.splitlines()[:2])
    tokens += int(counts["residues"]) + 2 * int(counts["sequences"])
rows = re.search(r"(\d+) training / (\d+) held-out rows of 64 tokens", r.stdout + r.stderr)
check(rows and int(rows[1]) + int(rows[2]) == -(-tokens // 65),
      f"all {len(data) // 2} data files are read: {rows[0] if rows else 'no rows line'}, "
      f"{tokens} tokens")
evals = [m for m in metrics(a) if "held_out_loss" in m]
first, last, unigram = evals[0]["held_out_loss"], evals[-1]["held_out_loss"], evals[-1]["unigram_loss"]
check(last < unigram and last < first,
      f"held-out loss falls: {first:.4f} -> {last:.4f}, below the unigram {unigram:.4f}")
steps = [m for m in metrics(a) if "loss" in m]
check(len(steps) == 90 and all(k in steps[0] for k in
                              ("lr", "grad_norm", "tokens_per_s", "tflops", "memory_mib")),
      "one metrics line per step with loss, lr, grad_norm, tokens/s, TFLOP/s, memory")
with open(os.path.join(a, "loss.png"), "rb") as f:
    check(f.read(8) == b"\x89PNG\r\n\x1a\n", "a loss-curve PNG")

# --- the trained model in transformers ---
# export_hf writes transformers' layout; Qwen3MoeForCausalLM.from_pretrained
# loads it, and its loss on a batch equals ours with the same weights.
hf_dir = export_hf(a, config, os.path.join(out, "hf"))
hf = Qwen3MoeForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").float()
ours = LanguageModel(config, batch=2, seq=64)
params = ours.from_hf(dict(hf.named_parameters()))
rng = np.random.default_rng(0)
ids = rng.integers(3, 24, (2, 64)).astype(np.int32)
with torch.no_grad():
    theirs = float(hf(input_ids=torch.tensor(ids, dtype=torch.long),
                      labels=torch.tensor(ids, dtype=torch.long)).loss)
mine = ours.loss(params, ids, LanguageModel.next_token_labels(ids))
check(abs(mine - theirs) <= 1e-5 * abs(theirs),
      f"the trained checkpoint loads into transformers: loss {theirs:.6f} there, {mine:.6f} here")

# --- packed rows masked at document boundaries ---
# --document-mask: each sequence of a row attends only to itself. The rows
# that hold the end of one sequence and the start of the next then see less,
# so the losses differ from the unmasked run's, and training still works.
dm = os.path.join(out, "documents")
r = train(*common, "--steps", "24", "--document-mask", "--out", dm)
masked = [m["loss"] for m in metrics(dm) if "loss" in m] if r.returncode == 0 else []
plain = [m["loss"] for m in metrics(a) if "loss" in m][:24]
check(len(masked) == 24 and all(np.isfinite(masked)) and masked[-1] < masked[0],
      f"--document-mask trains: loss {masked[0] if masked else 0:.4f} -> "
      f"{masked[-1] if masked else 0:.4f}")
check(masked and masked[0] != plain[0],
      f"and masks: first loss {masked[0] if masked else 0:.6f}, unmasked {plain[0]:.6f}")

# --- resume is exact ---
short = common + ["--steps", "24", "--checkpoint-every", "6"]
b, c = os.path.join(out, "b"), os.path.join(out, "c")
train(*short, "--out", b)
train(*short, "--out", c, "--stop-after-steps", "12")
check(max(m["step"] for m in metrics(c)) == 12, "--stop-after-steps stops at step 12")
r = train(*short, "--out", c, "--resume")
check(r.returncode == 0 and losses(b) == losses(c),
      "stop at 12 + resume to 24 gives the same 24 losses as one run")
with open(os.path.join(b, "checkpoint.safetensors"), "rb") as f1, \
        open(os.path.join(c, "checkpoint.safetensors"), "rb") as f2:
    check(f1.read() == f2.read(), "and the same checkpoint, byte for byte")

# --- the MXFP8 recipe: MXFP8 expert GEMMs forward and backward, the dense
# GEMMs (projections, router, LM head) in bf16 ---
x = os.path.join(out, "mxfp8")
r = train(*short, "--out", x, "--recipe", "mxfp8")
f32 = [m["loss"] for m in metrics(b) if "loss" in m]
mx = [m["loss"] for m in metrics(x) if "loss" in m]
gap = max(abs(p - q) for p, q in zip(f32, mx))
check(r.returncode == 0 and "mxfp8 GEMMs" in r.stderr and 0 < gap < 1e-2,
      f"--recipe mxfp8 trains; its 24 losses stay within {gap:.1e} of f32's (bound 1e-2)")
r = train(*short, "--out", x, "--resume", expect=1)
check(r.returncode == 1 and "made with recipe 'mxfp8', this run has 'none'" in r.stderr,
      "an MXFP8 checkpoint does not resume as f32")
r = train(*short, "--out", x, "--resume", "--recipe", "mxfp8", "--dense", "mxfp8", expect=1)
check(r.returncode == 1 and "made with recipe 'mxfp8', this run has 'mxfp8-dense-mxfp8'"
      in r.stderr, "nor with MXFP8 dense GEMMs")

# --- the blockwise FP8 recipe: E4M3 expert GEMMs with one power-of-two scale
# per 1 x 128 (activations, gradients) or 128 x 128 (weights) tile ---
x = os.path.join(out, "fp8-blockwise")
r = train(*short, "--out", x, "--recipe", "fp8-blockwise")
fb = [m["loss"] for m in metrics(x) if "loss" in m]
gap = max(abs(p - q) for p, q in zip(f32, fb)) if len(fb) == len(f32) else -1
check(r.returncode == 0 and "fp8-blockwise GEMMs" in r.stderr and 0 < gap < 1e-2,
      f"--recipe fp8-blockwise trains; its 24 losses stay within {gap:.1e} of f32's "
      "(bound 1e-2)")
check(fb != mx, "and differ from MXFP8's (another quantization)")
r = train(*short, "--out", x, "--resume", "--recipe", "mxfp8", expect=1)
check(r.returncode == 1 and "made with recipe 'fp8-blockwise', this run has 'mxfp8'"
      in r.stderr, "a blockwise FP8 checkpoint does not resume as MXFP8")
r = train(*short, "--out", os.path.join(out, "d"), "--dense", "mxfp8", expect=1)
check(r.returncode == 1 and "--dense needs --recipe" in r.stderr,
      "--dense without a recipe is refused")

# --- a kill while checkpointing leaves a complete checkpoint ---
k = os.path.join(out, "k")
train(*common, "--steps", "2", "--checkpoint-every", "1", "--out", k)
survived = 0
for delay in (0.4, 0.9, 1.5):
    p = subprocess.Popen([tool, "--config", config, *data, "--progress", "none", *common,
                          "--steps", "400", "--checkpoint-every", "1", "--out", k, "--resume"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    p.wait()
    survived += checkpoint_ok(os.path.join(k, "checkpoint.safetensors"))
check(survived == 3, "after 3 kills during per-step checkpointing the checkpoint is complete each time")
r = train(*common, "--steps", "400", "--out", k, "--resume", "--stop-after-steps", "1")
check(r.returncode == 0, "and resumes")

# --- SIGTERM and SIGINT: the step under way finishes, a checkpoint is
# written, exit 143 / 130; --resume then gives the uninterrupted run's
# losses and checkpoint (run b) ---
for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
    g = os.path.join(out, f"signal{code}")
    p = subprocess.Popen([tool, "--config", config, *data, "--progress", "none", *short,
                          "--checkpoint-every", "0", "--out", g],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    mpath = os.path.join(g, "metrics.jsonl")
    while time.time() < deadline and p.poll() is None:  # until it is training
        if os.path.exists(mpath) and os.path.getsize(mpath) > 0:
            break
        time.sleep(0.005)
    p.send_signal(sig)
    err = p.communicate(timeout=300)[1]
    stopped = [m["step"] for m in metrics(g) if "loss" in m]
    with open(os.path.join(g, "checkpoint.safetensors"), "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    at = int(json.loads(blob[8:8 + n])["__metadata__"]["step"])
    check(p.returncode == code and 0 < at < 24 and at == stopped[-1] and
          f"{sig.name}: stopped after step {at}" in err,
          f"{sig.name} at step {at}: exit {p.returncode}, a checkpoint of that step")
    r = train(*short, "--out", g, "--resume")
    with open(os.path.join(b, "checkpoint.safetensors"), "rb") as f1, \
            open(os.path.join(g, "checkpoint.safetensors"), "rb") as f2:
        same = f1.read() == f2.read()
    check(r.returncode == 0 and losses(g) == losses(b) and same,
          f"and --resume gives the uninterrupted run's 24 losses and checkpoint")
# --keep-checkpoints 3: the last three checkpoints under their step, the
# latest also as checkpoint.safetensors (hard links: no copies).
kdir = os.path.join(out, "keep")
r = train(*short, "--out", kdir, "--keep-checkpoints", "3")
names = sorted(f for f in os.listdir(kdir) if f.startswith("checkpoint"))
steps_of = {}
for f in names:
    with open(os.path.join(kdir, f), "rb") as fh:
        blob = fh.read()
    n = struct.unpack("<Q", blob[:8])[0]
    steps_of[f] = int(json.loads(blob[8:8 + n])["__metadata__"]["step"])
check(r.returncode == 0 and names == ["checkpoint-00000012.safetensors", "checkpoint-00000018.safetensors",
                                      "checkpoint-00000024.safetensors", "checkpoint.safetensors"]
      and steps_of["checkpoint-00000018.safetensors"] == 18 and steps_of["checkpoint.safetensors"] == 24
      and os.path.samefile(os.path.join(kdir, names[2]), os.path.join(kdir, names[3])),
      f"--keep-checkpoints 3 keeps steps 12, 18, 24 ({names})")
r = train(*short, "--out", os.path.join(out, "keep0"), "--keep-checkpoints", "0", expect=1)
check(r.returncode == 1 and "--keep-checkpoints" in r.stderr, "--keep-checkpoints 0 is refused")
t0 = metrics(b)[0]["time"]
check(all(abs(m["time"] - t0) < 3600 and m["time"] > 1.7e9 for m in metrics(b)),
      "every metrics line has its time (seconds since the Unix epoch)")

# --- bad input ---
ckpt = os.path.join(b, "checkpoint.safetensors")
with open(ckpt, "rb") as f:
    good = f.read()


def unchanged():
    with open(ckpt, "rb") as f:
        return f.read() == good


def refused(r, *fragments):
    return r.returncode == 1 and all(s in r.stderr for s in fragments)


# Partial checkpoints left by a writer killed between write and rename are
# removed when a run starts in that directory (a live writer's stay).
dead, alive = (os.path.join(b, f"checkpoint.safetensors.tmp.{pid}") for pid in (99999999, os.getpid()))
for path in (dead, alive):
    open(path, "wb").close()
# A run whose checkpoint already reaches --steps says so (once a silent
# exit 0) and leaves it as it is.
r = train(*short, "--out", b, "--resume")
check(r.returncode == 0 and "the checkpoint is at step 24, which reaches --steps 24: nothing to train"
      in r.stderr and unchanged(), "a checkpoint that reaches --steps: 'nothing to train'")
check(not os.path.exists(dead) and os.path.exists(alive),
      "a dead writer's partial checkpoint is removed, a live one's kept")
os.remove(alive)
# An --out that names a file is refused before anything is compiled (once
# 'cannot write afile/metrics.jsonl' after compiling).
afile = os.path.join(out, "afile")
open(afile, "w").close()
r = train(*short, "--out", afile, expect=1)
check(refused(r, f"--out '{afile}' is not a directory"), "an --out that names a file")
r = train(*short, "--out", b, expect=1)
check(refused(r, "exists: pass --resume") and unchanged(), "an existing checkpoint without --resume")
bad = os.path.join(out, "bad")
for name, blob, message in (("truncated", good[: len(good) // 2], "truncated"),
                            ("corrupt header", good[:8] + b"x" + good[9:], "corrupt header"),
                            ("tiny", good[:5], "truncated")):
    shutil.rmtree(bad, ignore_errors=True)
    os.makedirs(bad)
    with open(os.path.join(bad, "checkpoint.safetensors"), "wb") as f:
        f.write(blob)
    r = train(*short, "--out", bad, "--resume", expect=1)
    with open(os.path.join(bad, "checkpoint.safetensors"), "rb") as f:
        kept = f.read() == blob
    check(refused(r, message) and kept, f"a {name} checkpoint: '{message}', left as it was")
# A header string with a bad \\u escape, whole or partial, and a number out
# of range (each once an uncaught exception that aborted the trainer; the
# number found by moe-reader-fuzzer).
n = int.from_bytes(good[:8], "little")
for what, key in (("\\uZZZZ", b'"__metadata\\uZZZZ"'), ("\\u12ZZ", b'"__metadata\\u12ZZ"'),
                  ("a number out of range", b'"big": 3e333333, "__metadata__"')):
    header = good[8:8 + n].replace(b'"__metadata__"', key, 1)
    blob = len(header).to_bytes(8, "little") + header + good[8 + n:]
    shutil.rmtree(bad, ignore_errors=True)
    os.makedirs(bad)
    with open(os.path.join(bad, "checkpoint.safetensors"), "wb") as f:
        f.write(blob)
    r = train(*short, "--out", bad, "--resume", expect=1)
    check(refused(r, "corrupt header"), f"a header with {what}: 'corrupt header'")
# NaN in a tensor (once loaded and trained on), and trailing bytes after
# the header JSON within its length (refused as a corrupt header).
header = json.loads(good[8:8 + n])
name, entry = next((k, v) for k, v in header.items() if k != "__metadata__")
nan_at = 8 + n + entry["data_offsets"][0] + 4 * 3  # element 3 of the first tensor
trailing = good[8:8 + n] + b" xyz"
# A changed value is caught by the data's CRC-32 (--no-checksum skips it:
# then the NaN check still refuses a NaN).
flipped = good[:nan_at] + struct.pack("<f", 0.5) + good[nan_at + 4:]
with_nan = good[:nan_at] + struct.pack("<f", float("nan")) + good[nan_at + 4:]
for what, blob, message, extra in (
        ("a changed value", flipped, "do not match the checksum", []),
        ("NaN", with_nan, "do not match the checksum", []),
        ("NaN, unchecked", with_nan, f"tensor '{name}' holds NaN at element 3", ["--no-checksum"]),
        ("trailing header bytes", len(trailing).to_bytes(8, "little") + trailing + good[8 + n:],
         "corrupt header", [])):
    shutil.rmtree(bad, ignore_errors=True)
    os.makedirs(bad)
    with open(os.path.join(bad, "checkpoint.safetensors"), "wb") as f:
        f.write(blob)
    r = train(*short, "--out", bad, "--resume", *extra, expect=1)
    check(refused(r, message), f"a checkpoint with {what}: '{message}'")
# A directory where the checkpoint should be (once an allocation of
# LONG_MAX bytes and an abort).
shutil.rmtree(bad, ignore_errors=True)
os.makedirs(os.path.join(bad, "checkpoint.safetensors"))
r = train(*short, "--out", bad, "--resume", expect=1)
check(refused(r, "not a regular file"), "a directory named like the checkpoint: 'not a regular file'")
other = dict(json.load(open(config)), hidden_size=32, head_dim=8)
other_cfg = os.path.join(out, "other.json")
json.dump(other, open(other_cfg, "w"))
r = train(*short, "--out", b, "--resume", cfg=other_cfg, expect=1)
check(refused(r, "made with config") and unchanged(), "a checkpoint of another config")
r = train(*short[:-4], "--steps", "24", "--seq", "32", "--out", b, "--resume", expect=1)
check(refused(r, "made with seq '64'") and unchanged(), "a checkpoint of another run (--seq)")

seqs = os.path.join(out, "seqs")
os.makedirs(seqs)
for name, text, message in (("empty.fa", "", "empty.fa"),
                            ("bad.fa", ">p1\nMKV\n>p2\nMK1V\n", "bad.fa:4"),
                            ("noheader.fa", "MKVL\n", "noheader.fa:1")):
    path = os.path.join(seqs, name)
    with open(path, "w") as f:
        f.write(text)
    r = subprocess.run([tool, "--config", config, "--data", path, "--out", os.path.join(out, "x"),
                        "--progress", "none"], capture_output=True, text=True, timeout=600)
    check(r.returncode == 1 and message in r.stderr and not os.path.exists(
        os.path.join(out, "x", "checkpoint.safetensors")),
          f"{name}: refused, naming {message} ({r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''})")
small = dict(json.load(open(config)), vocab_size=10)
small_cfg = os.path.join(out, "small.json")
json.dump(small, open(small_cfg, "w"))
r = train("--out", os.path.join(out, "y"), cfg=small_cfg, expect=1)
check(refused(r, "'vocab_size' (10) is smaller than the protein tokenizer's 24 tokens"),
      "a vocabulary smaller than the tokenizer's")
r = train("--out", os.path.join(out, "z"), "--alphabet", "rna", expect=1)
check(refused(r, "--alphabet must be protein or dna"), "an unknown alphabet")

finish()
