# RUN: %python %s %t moe-train
#
# Auxiliary-loss-free balancing (DeepSeek-V3) in moe-train: with
# 'router_bias_update_rate' each MoE layer's router ranks experts by score +
# a bias the trainer moves after every step, by the rate, up for experts
# below the layer's mean load and down above it. Checked: the checkpoint's
# bias is what the logged loads give, step by step; the bias changes the
# routing (the loads differ from a run without it); resume is exact (bias
# included); export_hf leaves the bias out; LanguageModel takes a bias.
import json
import os
import shutil
import subprocess
import sys

import numpy as np

from checks import check, finish
from moe_mlir import hf
from moe_mlir.models import LanguageModel, export_hf

out, tool = sys.argv[1], sys.argv[2]
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
data = ["--data", "/usr/share/doc/hmmer/examples/tutorial/fn3.sto"]
rate = 0.01
base = {"model_type": "qwen3_moe", "vocab_size": 32, "hidden_size": 64, "intermediate_size": 96,
        "moe_intermediate_size": 32, "num_hidden_layers": 3, "mlp_only_layers": [1],
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8,
        "num_experts_per_tok": 2, "norm_topk_prob": True, "rope_theta": 10000.0}
paths = {}
for name, cfg in (("plain", base), ("bias", dict(base, router_bias_update_rate=rate))):
    paths[name] = os.path.join(out, f"{name}.json")
    with open(paths[name], "w") as f:
        json.dump(cfg, f)


def train(cfg, d, *args):
    r = subprocess.run([tool, "--config", paths[cfg], *data, "--batch", "2", "--seq", "32",
                        "--steps", "6", "--eval-every", "1", "--eval-batches", "1",
                        "--progress", "none", "--out", d, *args],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
    return r


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


a, b, c = (os.path.join(out, x) for x in ("a", "b", "c"))
ok = train("bias", a).returncode == 0 and train("plain", b).returncode == 0
tensors, meta = hf.read_safetensors(os.path.join(a, "checkpoint.safetensors"))
bias = tensors.get("router.selection_bias")
# Replay: each step's load (the evaluation line after it logs the step's).
want = np.zeros((2, 8), np.float32)
loads = [m["expert_load"] for m in metrics(a) if "expert_load" in m]
for load in loads:
    load = np.array(load, np.float64)
    want += (rate * np.sign(load.mean(axis=1, keepdims=True) - load)).astype(np.float32)
check(ok and bias is not None and bias.shape == (2, 8) and len(loads) == 6
      and np.array_equal(bias, want) and np.abs(bias).max() > 0,
      f"the checkpoint's bias is the loads' replay over 6 steps (max |bias| {np.abs(want).max():.2f})")
plain = [m["expert_load"] for m in metrics(b) if "expert_load" in m]
check(plain[0] == loads[0] and plain[-1] != loads[-1],
      "the bias starts at zero (same first routing) and then moves the routing")

# Resume: 3 steps, stop, 3 more: the same losses, loads and checkpoint.
train("bias", c, "--stop-after-steps", "3")
r = train("bias", c, "--resume")
with open(os.path.join(a, "checkpoint.safetensors"), "rb") as f1, \
        open(os.path.join(c, "checkpoint.safetensors"), "rb") as f2:
    same = f1.read() == f2.read()
check(r.returncode == 0 and same and [m.get("loss") for m in metrics(a)] ==
      [m.get("loss") for m in metrics(c)],
      "stop at 3 + resume to 6: the same losses and checkpoint bytes, bias included")

hf_dir = export_hf(a, paths["bias"], os.path.join(out, "hf"))
check("router.selection_bias" not in hf.read_weights(hf_dir),
      "export_hf leaves the bias out (transformers' Qwen3-MoE has none)")

model = LanguageModel(paths["bias"], batch=2, seq=32)
params = {n: tensors[n] for n in model.names}
ids = np.random.default_rng(0).integers(3, 24, (2, 32)).astype(np.int32)
labels = LanguageModel.next_token_labels(ids)
_, _, o0 = model.loss_grad(params, ids, labels, outputs=True)
_, _, o1 = model.loss_grad(params, ids, labels, outputs=True, router_bias=bias)
big = np.zeros((2, 8), np.float32)
big[:, 3] = 10  # every token's first pick: expert 3
_, _, o2 = model.loss_grad(params, ids, labels, outputs=True, router_bias=big)
check(not np.array_equal(o0["expert_load"], o1["expert_load"])
      and list(o2["expert_load"][:, 3]) == [64, 64],
      "LanguageModel takes the bias; a bias of 10 sends every token to its expert")
try:
    LanguageModel(paths["plain"], batch=2, seq=32).loss(params, ids, labels, router_bias=big)
    check(False, "a bias for a model without one is refused")
except ValueError as err:
    check("router_bias_update_rate" in str(err), f"a bias for a model without one: {err}")
finish()
