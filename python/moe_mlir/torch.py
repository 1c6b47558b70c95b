"""Run Hugging Face Qwen3-MoE sparse blocks through moe-mlir, in one line.

    import moe_mlir.torch
    moe_mlir.torch.patch(model)     # every Qwen3MoeSparseMoeBlock of the model

After the patch each block's forward runs moe-mlir's compiled MoE layer
(router, dispatch, SwiGLU experts, combine) on the same parameter tensors,
through a torch.autograd.Function whose backward is the compiled gradient
(moe_mlir.layers.moe_layer_backward): training works unchanged. Layers are
compiled per token count on first use and cached. The compiled layer
computes in f32, on the CPU for CPU tensors and on the GPU (through libmoert)
for CUDA tensors; inputs of other dtypes are converted and the result
converted back. Where MLIR is not installed, give patch() a folder of layers
compiled elsewhere with compile_layer().
"""

import os
import tempfile
import types

import numpy as np
import torch

from . import layers
from .runtime import load

_cache = {}
_cache_dir = None
#: Folders searched for precompiled layers (MOE_MLIR_ARTIFACTS, patch(artifacts=)).
artifact_dirs = [d for d in os.environ.get("MOE_MLIR_ARTIFACTS", "").split(":") if d]


def artifact_names(tokens, hidden, ffn, experts, top_k, norm, target):
    """File names of the forward and backward artifacts of one layer shape."""
    stem = f"moe_layer_{tokens}_{hidden}_{ffn}_{experts}_{top_k}_{int(bool(norm))}.{target}"
    return stem + ".fwd.so", stem + ".bwd.so"


def compile_layer(directory, tokens, hidden, ffn, experts, top_k, norm=True, target="cpu"):
    """Compiles the forward and backward of one layer shape into `directory`
    (e.g. on a machine with MLIR, for a GPU machine without); returns paths."""
    from . import Module  # needs the compiled extension
    fwd, bwd = (os.path.join(directory, n) for n in
                artifact_names(tokens, hidden, ffn, experts, top_k, norm, target))
    Module.parse(layers.moe_layer(tokens, hidden, ffn, experts, top_k, norm)).compile(target, fwd)
    Module.parse(layers.moe_layer_backward(tokens, hidden, ffn, experts, top_k, norm)).compile(
        target, bwd)
    return fwd, bwd


def _target(device):
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


def _kernels(tokens, hidden, ffn, experts, top_k, norm, target):
    """(forward, backward) callables of the compiled layer for this shape."""
    global _cache_dir
    key = (tokens, hidden, ffn, experts, top_k, norm, target)
    if key not in _cache:
        names = artifact_names(*key)
        for d in artifact_dirs:
            paths = [os.path.join(d, n) for n in names]
            if all(os.path.exists(p) for p in paths):
                break
        else:
            if _cache_dir is None:
                _cache_dir = tempfile.mkdtemp(prefix="moe_mlir_torch_")
            paths = compile_layer(_cache_dir, *key)
        _cache[key] = (load(paths[0]).moe_layer, load(paths[1]).moe_layer_backward)
    return _cache[key]


def _np(t):
    return t.detach().to("cpu", torch.float32).contiguous().numpy()


def _run(fn, tensors, device, dtype):
    """Calls a compiled function: CUDA tensors in place (f32), else numpy."""
    if device.type == "cuda":
        out = fn(*[t.detach().to(torch.float32).contiguous() for t in tensors])
        out = out if isinstance(out, tuple) else (out,)
        return [o.to(dtype) for o in out]
    out = fn(*[_np(t) for t in tensors])
    out = out if isinstance(out, tuple) else (out,)
    return [torch.from_numpy(np.array(o)).to(device, dtype) for o in out]


class MoELayerFunction(torch.autograd.Function):
    """y = moe_layer(x, router_w, w1, w2) with its compiled gradient."""

    @staticmethod
    def forward(ctx, x, router_w, w1, w2, top_k, norm):
        T, H = x.shape
        E, F = w1.shape[0], w2.shape[1]
        fwd, bwd = _kernels(T, H, F, E, top_k, norm, _target(x.device))
        ctx.save_for_backward(x, router_w, w1, w2)
        ctx.bwd = bwd
        return _run(fwd, (x, router_w, w1, w2), x.device, x.dtype)[0]

    @staticmethod
    def backward(ctx, dy):
        x, router_w, w1, w2 = ctx.saved_tensors
        grads = _run(ctx.bwd, (x, router_w, w1, w2, dy), x.device, torch.float32)
        like = (x, router_w, w1, w2)
        return (*[g.to(t.dtype) for g, t in zip(grads, like)], None, None)


def _forward(block, hidden_states):
    batch, seq, hidden = hidden_states.shape
    x = hidden_states.reshape(-1, hidden)
    router_w = block.gate.weight.t()                 # [H, E]
    w1 = block.experts.gate_up_proj.transpose(1, 2)  # [E, H, 2F]: gate | up
    w2 = block.experts.down_proj.transpose(1, 2)     # [E, F, H]
    y = MoELayerFunction.apply(x, router_w, w1, w2, block.gate.top_k,
                               bool(block.gate.norm_topk_prob))
    return y.reshape(batch, seq, hidden)


def patch(model, artifacts=None):
    """Routes every Qwen3MoeSparseMoeBlock of `model` through moe-mlir;
    returns the number of blocks patched. `artifacts`: a folder of layers
    precompiled with compile_layer (needed where MLIR is not installed).
    Raises TypeError if a block does not have the expected parameters
    (transformers' 3-D expert weights)."""
    if artifacts:
        artifact_dirs.insert(0, artifacts)
    count = 0
    for module in model.modules():
        if type(module).__name__ != "Qwen3MoeSparseMoeBlock":
            continue
        experts, gate = getattr(module, "experts", None), getattr(module, "gate", None)
        if not (hasattr(experts, "gate_up_proj") and hasattr(experts, "down_proj")
                and hasattr(gate, "weight") and hasattr(gate, "top_k")):
            raise TypeError("a Qwen3MoeSparseMoeBlock without 3-D expert weights "
                            "(experts.gate_up_proj/down_proj) and a top-k router: "
                            "this transformers version is not supported")
        act = getattr(experts, "act_fn", None)
        if act is not None and type(act).__name__ not in ("SiLUActivation", "SiLU"):
            raise TypeError(f"experts use {type(act).__name__}; moe-mlir's experts are SwiGLU")
        module.forward = types.MethodType(_forward, module)
        count += 1
    return count
