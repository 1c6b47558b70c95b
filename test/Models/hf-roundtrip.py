# RUN: %python %s %t moe-train
#
# Fine-tuning a transformers model: a tiny Qwen3-MoE (a dense layer, experts,
# transformers 5's config.json with num_local_experts and rope_parameters)
# saved by transformers itself, read by moe-train --init-from and by
# LanguageModel.from_pretrained, fine-tuned, exported back
# (moe_mlir.models.export_hf) and loaded by transformers:
# - both readers take the Hub layout (sharded, BF16, one tensor per expert)
#   and the fused layout (single file, F32 and F16) to the same f32 values;
# - our loss on transformers' weights equals transformers' (1e-5);
# - moe-train's run from the weights, exported in f32 (sharded) and bf16,
#   loads in transformers with our loss on the checkpoint (1e-5 f32, 1e-2
#   bf16), with a tokenizer AutoTokenizer reads as moe-train tokenizes;
# - bad directories fail before compiling, naming the file and the tensor.
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

from checks import check, finish
from moe_mlir import hf
from moe_mlir.models import LanguageModel, export_hf

out, tool = sys.argv[1], sys.argv[2]
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
data = ["--data", "/usr/share/doc/hmmer/examples/tutorial/fn3.sto"]
cfg = Qwen3MoeConfig(vocab_size=32, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                     num_hidden_layers=2, mlp_only_layers=[1], num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                     norm_topk_prob=True, max_position_embeddings=128)
torch.manual_seed(0)
model = Qwen3MoeForCausalLM(cfg)
with torch.no_grad():
    for name, p in model.named_parameters():
        # Norm weights near 1 (F16-exact once in bf16), matrices as initialized.
        if p.dim() == 1:
            p.copy_(1 + 0.1 * torch.randn_like(p))
model = model.to(torch.bfloat16)

# The Hub layout, as transformers saves it: shards, BF16, per-expert tensors.
hub = os.path.join(out, "hub")
model.save_pretrained(hub, max_shard_size="100KB")
with open(os.path.join(hub, "config.json")) as f:
    saved = json.load(f)
index = json.load(open(os.path.join(hub, "model.safetensors.index.json")))["weight_map"]
check("num_local_experts" in saved and "rope_parameters" in saved
      and "model.layers.0.mlp.experts.3.up_proj.weight" in index
      and len(set(index.values())) > 1,
      "transformers saved shards, per-expert tensors, a transformers 5 config")

# The fused layout (transformers 5's in-memory names): one file, F32, with
# the norms in F16.
fused = os.path.join(out, "fused")
os.makedirs(fused)
shutil.copy(os.path.join(hub, "config.json"), fused)
state = {n: p.detach().float().numpy() for n, p in model.named_parameters()}
hf.write_safetensors(os.path.join(fused, "model.safetensors"),
                     {n: t.astype(np.float16) if t.ndim == 1 else t for n, t in state.items()})

# --- Python: both layouts, and our loss against transformers' ---
ours, params = LanguageModel.from_pretrained(hub, batch=2, seq=32)
params_fused = ours.from_hf(hf.read_weights(fused))
check(all(np.array_equal(params[n], params_fused[n]) for n in ours.names),
      "from_pretrained (hub layout, BF16) and the fused F32/F16 file give the same weights")
check(all(np.array_equal(params[n], ours.from_hf(state)[n]) for n in ours.names),
      "and they are transformers' weights exactly")
rng = np.random.default_rng(0)
ids = rng.integers(3, 24, (2, 32)).astype(np.int32)


def transformers_loss(m, ids):
    with torch.no_grad():
        t = torch.tensor(ids, dtype=torch.long)
        return float(m(input_ids=t, labels=t).loss)


ref = Qwen3MoeForCausalLM.from_pretrained(hub, attn_implementation="eager").float()
theirs, mine = transformers_loss(ref, ids), ours.loss(params, ids, LanguageModel.next_token_labels(ids))
check(abs(mine - theirs) <= 1e-5 * abs(theirs),
      f"our loss on transformers' weights: {mine:.6f}, transformers {theirs:.6f}")


# --- moe-train --init-from ---
def train(*args, expect=0):
    r = subprocess.run([tool, *data, "--batch", "2", "--seq", "32", "--progress", "none",
                        "--eval-every", "0", *args], capture_output=True, text=True, timeout=600)
    if r.returncode != expect:
        print(r.stdout, r.stderr)
    return r


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def checkpoint(d):
    tensors, meta = hf.read_safetensors(os.path.join(d, "checkpoint.safetensors"))
    return tensors, meta


# One step at a learning rate of 1e-12 leaves the weights as read (changes
# below 1e-11): the checkpoint shows what --init-from loaded.
still = os.path.join(out, "still")
r = train("--init-from", fused, "--steps", "1", "--lr", "1e-12", "--warmup", "0", "--out", still)
tensors, meta = checkpoint(still)
expected = ours.from_hf(state)
gap = max(float(np.max(np.abs(tensors[n] - expected[n]))) for n in ours.names)
check(r.returncode == 0 and gap <= 1e-11 and meta.get("init_from") == os.path.realpath(fused),
      f"--init-from (fused, F32/F16) loads transformers' weights: max change {gap:.1e}")

# Fine-tuning from the Hub layout.
tuned = os.path.join(out, "tuned")
r = train("--init-from", hub, "--steps", "6", "--lr", "1e-3", "--warmup", "0", "--out", tuned)
r1 = train("--init-from", hub, "--steps", "1", "--lr", "1e-12", "--warmup", "0",
           "--out", os.path.join(out, "still-hub"))
check(r.returncode == 0 and r1.returncode == 0
      and metrics(os.path.join(out, "still-hub"))[0]["loss"] == metrics(still)[0]["loss"],
      "--init-from (hub layout: shards, BF16, per-expert) gives the same first loss, bit for bit")
steps = [m for m in metrics(tuned) if "loss" in m]
final = [m for m in metrics(tuned) if "held_out_loss" in m][-1]
check(all(len(m["load_max"]) == 1 and 1 <= m["load_max"][0] <= 4 for m in steps)
      and len(final["expert_load"]) == 1 and sum(final["expert_load"][0]) == 2 * 32 * 2,
      f"metrics: the busiest expert's load per MoE layer each step ({steps[-1]['load_max']}), "
      f"every expert's at evaluations ({final['expert_load']})")
tensors, meta = checkpoint(tuned)
trained = {n: tensors[n] for n in ours.names}
moved = max(float(np.max(np.abs(trained[n] - expected[n]))) for n in ours.names)
check(moved > 1e-4, f"six steps change the weights (by up to {moved:.1e})")
mine = ours.loss(trained, ids, LanguageModel.next_token_labels(ids))

f32 = export_hf(tuned, None, os.path.join(out, "export-f32"), max_shard_size="200KB")
check(os.path.exists(os.path.join(f32, "model.safetensors.index.json"))
      and os.path.exists(os.path.join(f32, "generation_config.json")),
      "export_hf writes shards with an index above max_shard_size, and a generation config")
back = AutoModelForCausalLM.from_pretrained(f32, attn_implementation="eager")
theirs = transformers_loss(back.float(), ids)
check(back.dtype == torch.float32 and abs(mine - theirs) <= 1e-5 * abs(theirs),
      f"the fine-tuned model in f32 loads in transformers: loss {theirs:.6f} there, {mine:.6f} here")
bf16 = export_hf(tuned, None, os.path.join(out, "export-bf16"), dtype="bfloat16")
back = AutoModelForCausalLM.from_pretrained(bf16, attn_implementation="eager")
theirs = transformers_loss(back, ids)
check(back.dtype == torch.bfloat16 and abs(mine - theirs) <= 1e-2 * abs(theirs),
      f"and in bf16: loss {theirs:.6f} there, {mine:.6f} here (bound 1e-2)")
# The command line: python -m moe_mlir export-hf.
cli = os.path.join(out, "export-cli")
r = subprocess.run([sys.executable, "-m", "moe_mlir", "export-hf", tuned, cli, "--dtype", "bfloat16"],
                   capture_output=True, text=True, timeout=300)
bad = subprocess.run([sys.executable, "-m", "moe_mlir", "export-hf", os.path.join(out, "nowhere"),
                      os.path.join(out, "x")], capture_output=True, text=True, timeout=300)
check(r.returncode == 0 and all(np.array_equal(a, b) for a, b in zip(
          hf.read_weights(cli).values(), hf.read_weights(bf16).values()))
      and bad.returncode == 1 and "nowhere" in bad.stderr,
      "python -m moe_mlir export-hf writes the same model; a missing run is an error: "
      + bad.stderr.strip())
again = ours.from_hf(hf.read_weights(f32))
check(all(np.array_equal(again[n], trained[n]) for n in ours.names),
      "the f32 export reads back to the checkpoint's weights exactly")

tok = AutoTokenizer.from_pretrained(f32)
letters = "ACDEFGHIKLMNPQRSTVWYX"
enc = tok("MKvb")["input_ids"]
check(enc == [1, 3 + letters.index("M"), 3 + letters.index("K"), 3 + letters.index("V"),
              3 + letters.index("X"), 2]
      and tok.pad_token_id == 0 and tok.decode(enc, skip_special_tokens=True) == "MKVX",
      f"AutoTokenizer reads the protein tokenizer as moe-train tokenizes: {enc}")
dna = hf.write_model(os.path.join(out, "dna"), {}, {}, alphabet="dna")
check(AutoTokenizer.from_pretrained(dna)("acgu")["input_ids"] == [1, 3, 4, 5, 6, 2],
      "and the DNA one (U read as T)")

# --- bad directories: clear errors before compiling ---
def refused(args, words, what):
    r = train(*args, "--out", os.path.join(out, "bad"), expect=1)
    text = r.stderr
    check(r.returncode == 1 and all(w in text for w in words) and "train_step" not in text,
          f"{what}: {text.strip().splitlines()[-1] if text.strip() else '(no message)'}")


refused(["--init-from", os.path.join(out, "nowhere")], ["nowhere"], "a missing directory")
broken = os.path.join(out, "broken")
shutil.copytree(hub, broken)
first = sorted(f for f in os.listdir(broken) if f.startswith("model-"))[0]
os.unlink(os.path.join(broken, first))
refused(["--init-from", broken], [first], "a missing shard")
other = os.path.join(out, "other")
os.makedirs(other)
with open(os.path.join(other, "config.json"), "w") as f:
    json.dump(dict(saved, hidden_size=32, head_dim=8), f)
shutil.copy(os.path.join(hub, "config.json"), os.path.join(out, "hub-config.json"))
refused(["--init-from", hub, "--config", os.path.join(other, "config.json")],
        ["model.embed_tokens.weight", "shape"], "weights of another config")
nan = os.path.join(out, "nan")
os.makedirs(nan)
shutil.copy(os.path.join(hub, "config.json"), nan)
bad_state = dict(state)
bad_state["model.norm.weight"] = state["model.norm.weight"].copy()
bad_state["model.norm.weight"][5] = np.nan
hf.write_safetensors(os.path.join(nan, "model.safetensors"), bad_state)
r = train("--init-from", nan, "--out", os.path.join(out, "bad"), "--steps", "1", expect=1)
check(r.returncode == 1 and "model.norm.weight" in r.stderr and "NaN" in r.stderr,
      "NaN weights are refused, naming the tensor")
r = train("--init-from", hub, "--resume", "--out", os.path.join(out, "bad"), expect=1)
check(r.returncode == 1 and "--init-from" in r.stderr and "--resume" in r.stderr,
      "--init-from with --resume is refused")
finish()
