# RUN: %python %s %t moe-model
#
# The whole model against one nobody here wrote: transformers' own
# Qwen3MoeForCausalLM (CPU, f32, eager attention) with a tiny config that has
# a dense layer and an MoE layer, and the graph moe-model builds from the same
# config.json, on the same weights (theirs, by their parameter names) and
# the same batch: loss and every parameter's gradient. Three configs: without
# router losses; with transformers' load-balancing loss
# (output_router_logits, router_aux_loss_coef) over two MoE layers; and with
# a router z-loss besides (router_z_loss_coef, which transformers' Qwen3-MoE
# does not compute: the reference adds the ST-MoE z-loss of its router
# logits, mean over all MoE layers' rows of logsumexp^2).
#
# Tolerance: both compute in f32 but sum in different orders (BLAS and
# torch's softmax/attention kernels vs in-order reductions): the loss agrees
# to 1e-5 relative, every gradient to 1e-4 of its largest entry.
import json
import os
import subprocess
import sys

import numpy as np
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

import moe_mlir
from checks import check, finish

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


base = {"model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "vocab_size": 29, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [0],
        "tie_word_embeddings": False, "hidden_act": "silu", "rope_scaling": None}
B, S = 2, 12
tool = sys.argv[2]


def crosscheck(name, cfg, z_coef=0.0):
    path = os.path.join(out, f"config-{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    torch.manual_seed(0)
    hf = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{k: v for k, v in cfg.items()
                                               if k not in ("model_type", "router_z_loss_coef")},
                                            attn_implementation="eager")).float()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ids = torch.randint(0, cfg["vocab_size"], (B, S))
    out_hf = hf(input_ids=ids, labels=ids)
    ref_loss = out_hf.loss
    if cfg.get("output_router_logits"):
        plain = float(hf.loss_function(out_hf.logits, ids, cfg["vocab_size"]))
        check(abs(float(ref_loss) - plain) > 1e-3 * abs(plain),
              f"{name}: transformers' load-balancing loss is in its loss "
              f"({float(ref_loss) - plain:+.4f})")
    if z_coef:
        lse = torch.logsumexp(torch.cat(out_hf.router_logits).float(), dim=-1)
        ref_loss = ref_loss + z_coef * (lse ** 2).mean()
    ref_loss.backward()
    theirs = dict(hf.named_parameters())

    listing = subprocess.run([tool, path, "--parameters"], check=True, capture_output=True,
                             timeout=600, text=True).stdout.splitlines()
    params = []
    for line in listing[:-1]:
        pname, rest = line.split(" [", 1)
        shape = [int(d) for d in rest.split("]")[0].split(",")]
        params.append((pname, shape, "hf_transposed" in rest))
    check({n for n, _, _ in params} == set(theirs),
          f"{name}: the {len(params)} parameters are transformers' parameters, by name")

    text = subprocess.run([tool, path, "--batch", str(B), "--seq", str(S), "--train-step"],
                          timeout=600, check=True, capture_output=True, text=True).stdout
    check(("moe.router_loss" in text) == bool(cfg.get("output_router_logits") or z_coef),
          f"{name}: the graph has a router loss exactly when the config asks for one")
    so = os.path.join(out, f"model-{name}.so")
    moe_mlir.Module.parse(text).compile("cpu", so)
    art = moe_mlir.load(so)

    def ours(t, transposed):
        a = t.detach().numpy()
        return np.ascontiguousarray(np.swapaxes(a, -1, -2) if transposed else a).astype(np.float32)

    weights = [ours(theirs[n], tr) for n, _, tr in params]
    for (n, shape, _), w in zip(params, weights, strict=True):
        if list(w.shape) != shape:
            check(False, f"{name}: {n}: shape {list(w.shape)} vs ours {shape}")
    ids_np = ids.numpy().astype(np.int32)
    labels = np.full_like(ids_np, -100)
    labels[:, :-1] = ids_np[:, 1:]
    loss, *rest = art.loss_grad(*weights, ids_np, labels)
    # The gradients, then the outputs (moe.output): the expert load.
    specs = art.functions["loss_grad"][1][1:]
    grads = [r for r, spec in zip(rest, specs, strict=True) if spec.output is None]
    outputs = {spec.output: r for r, spec in zip(rest, specs, strict=True) if spec.output}
    k, experts = cfg["num_experts_per_tok"], cfg["num_experts"]
    picked = [torch.topk(torch.softmax(lg.float(), -1), k, dim=-1).indices.flatten()
              for lg in out_hf.router_logits] if cfg.get("output_router_logits") else None
    load = outputs.get("expert_load")
    check(load is not None and load.shape == (cfg["num_hidden_layers"] - 1, experts)
          and all(int(x) == B * S * k for x in load.sum(axis=1))
          and (picked is None or all(
              np.array_equal(load[i], np.bincount(p.numpy(), minlength=experts))
              for i, p in enumerate(picked))),
          f"{name}: the expert_load output counts each MoE layer's top-{k} "
          + ("as transformers' routers pick them" if picked else "assignments"))
    # One gradient per parameter, in order: a short list would make the zip
    # below check fewer silently.
    check(len(grads) == len(params) and len(params) == len(theirs),
          f"{name}: {len(grads)} gradients for {len(params)} parameters "
          f"({len(theirs)} in transformers' model)")
    ref = float(ref_loss.detach())
    check(abs(float(loss) - ref) <= 1e-5 * abs(ref),
          f"{name}: loss {float(loss):.7f} vs transformers {ref:.7f}")
    worst = (0.0, "")
    for (n, _, tr), g in zip(params, grads, strict=True):
        want = ours(theirs[n].grad, tr)
        err = float(np.max(np.abs(g - want)) / max(np.max(np.abs(want)), 1e-30))
        worst = max(worst, (err, n))
        if err > 1e-4:
            check(False, f"{name}: d/d{n}: {err:.2e} of its largest entry")
    check(worst[0] <= 1e-4, f"{name}: all {len(params)} gradients within 1e-4 of their largest "
                            f"entry (worst {worst[0]:.1e}, {worst[1]})")


crosscheck("plain", base)
# Two MoE layers (the load-balancing loss counts all layers' rows together)
# and a coefficient large enough to move every router gradient.
aux = dict(base, num_hidden_layers=3, output_router_logits=True, router_aux_loss_coef=0.5)
crosscheck("aux", aux)
crosscheck("aux+z", dict(aux, router_z_loss_coef=0.1), z_coef=0.1)
finish()
