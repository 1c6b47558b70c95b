"""Run Hugging Face Qwen3-MoE sparse blocks through moe-mlir, in one line.

    import moe_mlir.torch
    moe_mlir.torch.patch(model)     # every Qwen3MoeSparseMoeBlock of the model

After the patch each block's forward runs moe-mlir's compiled MoE layer
(router, dispatch, SwiGLU experts, combine) on the same parameter tensors,
through a torch.autograd.Function whose backward is the compiled gradient
(moe_mlir.layers.moe_layer_backward): training works unchanged. Layers are
compiled per token count on first use and cached. The compiled layer
computes in f32 on the CPU; inputs of other dtypes are converted and the
result converted back.
"""

import os
import tempfile
import types

import numpy as np
import torch

from . import layers
from ._mlir import Module
from .runtime import load

_cache = {}
_cache_dir = None


def _kernels(tokens, hidden, ffn, experts, top_k, norm):
    """(forward, backward) callables of the compiled layer for this shape."""
    global _cache_dir
    key = (tokens, hidden, ffn, experts, top_k, norm)
    if key not in _cache:
        if _cache_dir is None:
            _cache_dir = tempfile.mkdtemp(prefix="moe_mlir_torch_")
        stem = os.path.join(_cache_dir, "_".join(map(str, key)))
        Module.parse(layers.moe_layer(tokens, hidden, ffn, experts, top_k, norm)).compile(
            "cpu", stem + ".fwd.so")
        Module.parse(layers.moe_layer_backward(tokens, hidden, ffn, experts, top_k, norm)).compile(
            "cpu", stem + ".bwd.so")
        _cache[key] = (load(stem + ".fwd.so").moe_layer,
                       load(stem + ".bwd.so").moe_layer_backward)
    return _cache[key]


def _np(t):
    return t.detach().to("cpu", torch.float32).contiguous().numpy()


class MoELayerFunction(torch.autograd.Function):
    """y = moe_layer(x, router_w, w1, w2) with its compiled gradient."""

    @staticmethod
    def forward(ctx, x, router_w, w1, w2, top_k, norm):
        T, H = x.shape
        E, F = w1.shape[0], w2.shape[1]
        fwd, bwd = _kernels(T, H, F, E, top_k, norm)
        ctx.save_for_backward(x, router_w, w1, w2)
        ctx.bwd = bwd
        y = fwd(_np(x), _np(router_w), _np(w1), _np(w2))
        return torch.from_numpy(np.array(y)).to(x.device, x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, router_w, w1, w2 = ctx.saved_tensors
        grads = ctx.bwd(_np(x), _np(router_w), _np(w1), _np(w2), _np(dy))
        like = (x, router_w, w1, w2)
        out = [torch.from_numpy(np.array(g)).to(t.device, t.dtype) for g, t in zip(grads, like)]
        return (*out, None, None)


def _forward(block, hidden_states):
    batch, seq, hidden = hidden_states.shape
    x = hidden_states.reshape(-1, hidden)
    router_w = block.gate.weight.t()                 # [H, E]
    w1 = block.experts.gate_up_proj.transpose(1, 2)  # [E, H, 2F]: gate | up
    w2 = block.experts.down_proj.transpose(1, 2)     # [E, F, H]
    y = MoELayerFunction.apply(x, router_w, w1, w2, block.gate.top_k,
                               bool(block.gate.norm_topk_prob))
    return y.reshape(batch, seq, hidden)


def patch(model):
    """Routes every Qwen3MoeSparseMoeBlock of `model` through moe-mlir;
    returns the number of blocks patched. Raises TypeError if a block does
    not have the expected parameters (transformers' 3-D expert weights)."""
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
