"""Fine-tuning a transformers model with moert-train, and back: the check
behind bench/run-hf-finetune.sh (also usable on the CPU with CPU artifacts).

    python3 bench/hf_finetune.py CONFIG ARTIFACT_DIR DATA OUT [STEPS]

ARTIFACT_DIR holds two train steps of CONFIG compiled by `moe-train
--compile-only` with the same --batch and --seq: train_step-<target>.so (f32)
and train_step-<target>-bf16.so. transformers builds Qwen3MoeForCausalLM from
CONFIG (seeded), saves it as the Hub has such models (bf16, sharded,
per-expert tensors); moert-train fine-tunes it (--init-from, bf16 recipe,
STEPS steps); export_hf writes the result in f32 and in bf16; transformers
loads both. On one batch of protein tokens, our compiled loss on the
checkpoint's weights is compared with transformers' loss on each export:
f32 step vs f32 model (bound 1e-5 relative), bf16 step vs bf16 model
(1e-2). The same before fine-tuning, on the saved model. Prints a table;
exits 1 when a bound fails.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

import moe_mlir
from moe_mlir import hf
from moe_mlir.models import export_hf

config_path, artifacts, data, out = sys.argv[1:5]
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 20
moert_train = os.environ.get("MOERT_TRAIN", "moert-train")
device = "cuda" if torch.cuda.is_available() else "cpu"
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
f32_so = [p for p in glob.glob(os.path.join(artifacts, "train_step-*.so")) if "-bf16" not in p][0]
bf16_so = glob.glob(os.path.join(artifacts, "train_step-*-bf16.so"))[0]
art32, art16 = moe_mlir.load(f32_so), moe_mlir.load(bf16_so)
args, _ = art32.functions["loss"]
names = [a.param for a in args if a.param]
transposed = {a.param for a in args if a.param and a.hf_transposed}
batch, seq = args[len(names)].shape
rows = []
failed = False


def timed(what, fn):
    start = time.time()
    result = fn()
    print(f"{what}: {time.time() - start:.1f} s", flush=True)
    return result


# --- the model as the Hub would have it ---
with open(config_path) as f:
    cfg = json.load(f)
torch.manual_seed(0)
model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
hub = os.path.join(out, "hub")
timed("save_pretrained (bf16, sharded)",
      lambda: model.to(torch.bfloat16).save_pretrained(hub, max_shard_size="2GB"))
del model

# One batch of residue tokens: <bos>=1, letters 3..23, next-token labels.
rng = np.random.default_rng(0)
ids = rng.integers(3, 24, (batch, seq)).astype(np.int32)
ids[:, 0] = 1
labels = np.full_like(ids, -100)
labels[:, :-1] = ids[:, 1:]


def ours(art, weights):
    out = art.loss(*[weights[n] for n in names], ids, labels)
    return float(np.asarray(out[0] if isinstance(out, (tuple, list)) else out))


def theirs(path, dtype):
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    with torch.no_grad():
        t = torch.tensor(ids, dtype=torch.long, device=device)
        lab = torch.tensor(labels, dtype=torch.long, device=device)
        loss = float(m(input_ids=t, labels=None).logits.float().log_softmax(-1)
                     .gather(-1, lab.clamp(min=0).unsqueeze(-1)).squeeze(-1)
                     .masked_fill(lab < 0, 0).sum().neg() / (lab >= 0).sum())
    del m
    if device == "cuda":
        torch.cuda.empty_cache()
    return loss


def compare(stage, weights, f32_dir, bf16_dir):
    global failed
    for label, art, path, dtype, bound in (
            ("f32", art32, f32_dir, torch.float32, 1e-5),
            ("bf16", art16, bf16_dir, torch.bfloat16, 1e-2)):
        a = timed(f"{stage}: our {label} loss", lambda: ours(art, weights))
        b = timed(f"{stage}: transformers {label}", lambda: theirs(path, dtype))
        rel = abs(a - b) / abs(b)
        ok = rel <= bound
        failed |= not ok
        rows.append((stage, label, a, b, rel, bound, ok))


# --- before: our reader on the saved model ---
state = hf.read_weights(hub)
weights = {n: np.ascontiguousarray(np.swapaxes(state[n], -1, -2) if n in transposed else state[n])
           for n in names}
compare("as saved", weights, hub, hub)
del state, weights

# --- fine-tune, export, reload ---
run = os.path.join(out, "run")
r = timed(f"moert-train --init-from, {steps} bf16 steps", lambda: subprocess.run(
    [moert_train, bf16_so, "--init-from", hub, "--data", data, "--steps", str(steps),
     "--warmup", "2", "--lr", "1e-4", "--eval-every", "0", "--progress", "none", "--out", run],
    capture_output=True, text=True))
print(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "(no output)")
if r.returncode != 0:
    print(r.stdout, r.stderr)
    sys.exit(1)
losses = [json.loads(line)["loss"] for line in open(os.path.join(run, "metrics.jsonl"))
          if '"loss"' in line]
tensors, _ = hf.read_safetensors(os.path.join(run, "checkpoint.safetensors"),
                                 keep=set(names).__contains__)
weights = {n: np.ascontiguousarray(tensors[n]) for n in names}
del tensors
f32_dir = timed("export_hf f32", lambda: export_hf(run, None, os.path.join(out, "f32")))
bf16_dir = timed("export_hf bf16", lambda: export_hf(run, None, os.path.join(out, "bf16"),
                                                     dtype="bfloat16"))
compare(f"after {steps} steps", weights, f32_dir, bf16_dir)

print(f"\nfine-tuning losses: {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
print(f"\n| weights | precision | ours | transformers | relative gap | bound | |")
print("|---|---|---|---|---|---|---|")
for stage, label, a, b, rel, bound, ok in rows:
    print(f"| {stage} | {label} | {a:.6f} | {b:.6f} | {rel:.1e} | {bound:.0e} | "
          f"{'ok' if ok else 'FAIL'} |")
sys.exit(1 if failed else 0)
