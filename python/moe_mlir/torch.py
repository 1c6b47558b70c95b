"""Run Hugging Face Qwen3-MoE sparse blocks through moe-mlir, in one line.

    import moe_mlir.torch
    moe_mlir.torch.patch(model)                   # bf16 GEMMs on a GPU
    moe_mlir.torch.patch(model, recipe="mxfp8")   # MXFP8 expert GEMMs

After the patch each Qwen3MoeSparseMoeBlock's forward runs moe-mlir's
compiled MoE layer (router, dispatch, SwiGLU experts, combine) on the same
parameter tensors, through a torch.autograd.Function: the forward returns the
output and the residuals its backward reads (-moe-split-backward), the
backward the gradients. Training works unchanged.

On CUDA tensors the layer runs on the GPU's dedicated kernels under the
recipe (bf16: bf16 GEMMs with f32 accumulation; mxfp8: MXFP8 expert GEMMs
and bf16 dense ones; none: f32 as written, generic kernels), on torch's
current stream, without synchronizing, reading the tensors in place and
returning results torch uses in place. Arguments and results have the
block's dtype (bf16 or f32; the layer computes in f32 between its GEMMs).
On CPU tensors the layer runs in f32 (recipe none).

Token counts are bucketed (rounded up: at most 4 buckets per power of two,
padding rows that change no result), and compiled layers are kept in an
on-disk cache (MOE_MLIR_CACHE, default ~/.cache/moe_mlir), so new batch
shapes compile at most once per bucket and machine. Where MLIR is not
installed, compile the layers elsewhere with precompile() (or
`python -m moe_mlir torch-precompile`) and give the folder to patch(artifacts=)
or MOE_MLIR_ARTIFACTS.
"""

import hashlib
import os
import tempfile
import types

import numpy as np

try:  # precompile() and the cache work without torch (a build machine)
    import torch
except ImportError:
    torch = None

from . import layers
from .runtime import load

#: Folders searched for precompiled layers (MOE_MLIR_ARTIFACTS, patch(artifacts=)).
artifact_dirs = [d for d in os.environ.get("MOE_MLIR_ARTIFACTS", "").split(":") if d]
#: Recipes patch() takes ("auto": bf16 on GPUs, none on the CPU).
RECIPES = ("auto", "none", "bf16", "mxfp8")
#: The calling convention of the compiled layers (part of their file names'
#: digest, with the layer's MLIR and pipeline): raised when it changes.
ABI = 1
_loaded = {}


def cache_dir():
    """Where compiled layers are cached: MOE_MLIR_CACHE, else
    $XDG_CACHE_HOME/moe_mlir, else ~/.cache/moe_mlir."""
    if os.environ.get("MOE_MLIR_CACHE"):
        return os.environ["MOE_MLIR_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "moe_mlir")


def bucket(tokens):
    """The token count a layer is compiled for: `tokens` rounded up to a
    multiple of a quarter of its power of two (at least 16), so 2048 stays
    2048 and 3000 becomes 3072."""
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be a positive integer, got {tokens!r}")
    step = max(16, 1 << max(0, tokens.bit_length() - 3))
    return -(-tokens // step) * step


def _check_recipe(recipe, hidden=None, ffn=None, allowed=RECIPES):
    """Raises ValueError for a recipe not in `allowed`, or mxfp8 at dims
    (when given) that are not multiples of 32."""
    if recipe not in allowed:
        raise ValueError(f"recipe must be one of {', '.join(allowed)}, got {recipe!r}")
    if recipe == "mxfp8" and hidden is not None and (hidden % 32 or ffn % 32):
        raise ValueError(f"recipe mxfp8 needs hidden ({hidden}) and expert FFN ({ffn}) sizes "
                         "that are multiples of 32; use recipe='bf16'")


class Layer:
    """One compiled layer shape: tokens, hidden, ffn, experts, top_k,
    norm_topk_prob, dtype ('f32' or 'bf16'), recipe ('none', 'bf16',
    'mxfp8') and target ('cpu' or a chip such as 'sm_90a')."""

    def __init__(self, tokens, hidden, ffn, experts, top_k, norm, dtype, recipe, target):
        _check_recipe(recipe, hidden, ffn, allowed=RECIPES[1:])
        self.key = (tokens, hidden, ffn, experts, top_k, bool(norm), dtype, recipe, target)
        pad = 32 if recipe == "mxfp8" else 1
        self.text = layers.moe_layer_vjp(tokens, hidden, ffn, experts, top_k, bool(norm),
                                         dtype=dtype, pad_to=pad)
        self.pipeline = layers.vjp_pipeline(recipe)
        digest = hashlib.sha256("\n".join((self.text, self.pipeline, target, str(ABI)))
                                .encode()).hexdigest()[:16]
        self.name = (f"moe_block_{tokens}_{hidden}_{ffn}_{experts}_{top_k}_{int(bool(norm))}_"
                     f"{dtype}_{recipe}.{target}.{digest}.so")

    def compile(self, directory):
        """Compiles into `directory` (written under a temporary name and
        renamed, so concurrent processes never see half a file); returns the
        path."""
        from . import Module  # needs the compiled extension (and MLIR)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, self.name)
        module = Module.parse(self.text)
        module.run(self.pipeline)
        fd, tmp = tempfile.mkstemp(prefix=".compiling-", suffix=".so", dir=directory)
        os.close(fd)
        try:
            module.compile(self.key[-1], tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    def find_or_compile(self):
        folders = artifact_dirs + [cache_dir()]
        for d in folders:
            path = os.path.join(d, self.name)
            if os.path.exists(path):
                return path
        try:
            return self.compile(folders[-1])
        except ImportError as err:
            raise RuntimeError(
                f"no compiled layer {self.name} in {', '.join(folders)}, "
                f"and this machine cannot compile it ({err}); compile it where moe-mlir's "
                "compiler is installed with moe_mlir.torch.precompile(...) and pass the "
                "folder as patch(model, artifacts=...) or MOE_MLIR_ARTIFACTS") from None


def precompile(directory, hidden, ffn, experts, top_k, tokens, norm_topk_prob=True,
               dtype="bf16", recipe="bf16", target="sm_90a"):
    """Compiles the layer for each token count's bucket into `directory`,
    for a machine without MLIR (patch(artifacts=directory)); returns the
    paths. `tokens`: an int or a list (batch x sequence of the runs)."""
    tokens = [tokens] if isinstance(tokens, int) else list(tokens)
    return [Layer(t, hidden, ffn, experts, top_k, norm_topk_prob, dtype, recipe, target)
            .compile(directory) for t in sorted({bucket(t) for t in tokens})]


def _kernels(*key):
    """The artifact of Layer(*key), loaded once a process (a step looks it
    up by its key: no MLIR text is made again)."""
    artifact = _loaded.get(key)
    if artifact is None:
        artifact = _loaded[key] = load(Layer(*key).find_or_compile())
    return artifact


_targets = {}


def _target(device):
    if device.type != "cuda":
        return "cpu"
    if device.index not in _targets:
        major, minor = torch.cuda.get_device_capability(device)
        _targets[device.index] = f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"
    return _targets[device.index]


_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"} if torch else {}


def _call(artifact, name, tensors):
    if artifact.gpu:
        return artifact.call_torch(name, *tensors)
    out = artifact.call(name, *[
        t.detach().to("cpu", torch.float32 if t.is_floating_point() else t.dtype)
        .contiguous().numpy() for t in tensors])
    out = out if isinstance(out, tuple) else (out,)
    return [torch.from_numpy(np.array(o)) for o in out]


class MoELayerFunction(torch.autograd.Function if torch else object):
    """y = moe_layer(x, router_w, w1, w2) with its compiled gradient."""

    @staticmethod
    def forward(ctx, x, router_w, w1, w2, top_k, norm, recipe):
        T, H = x.shape
        E, F = w1.shape[0], w2.shape[1]
        gpu = x.device.type == "cuda"
        if recipe == "auto":
            recipe = "bf16" if gpu else "none"
        dtype = _DTYPES.get(x.dtype) if gpu else "f32"
        if dtype is None:
            raise TypeError(f"moe_mlir.torch: hidden states of {x.dtype}; the layer takes "
                            "float32 or bfloat16")
        if not gpu and recipe != "none":
            raise ValueError(f"recipe {recipe!r} needs CUDA tensors (the CPU layer is f32)")
        tb = bucket(T)
        artifact = _kernels(tb, H, F, E, top_k, bool(norm), dtype, recipe, _target(x.device))
        params = [p if p.dtype == x.dtype else p.to(x.dtype) for p in (router_w, w1, w2)]
        xin = x if tb == T else torch.cat([x, x.new_zeros(tb - T, H)])
        out = _call(artifact, "moe_block_grad_forward", [xin, *params])
        y, residuals = out[0], out[1:]
        ctx.save_for_backward(xin, *params, *residuals)
        ctx.artifact, ctx.tokens, ctx.dtypes = artifact, T, (x.dtype, router_w.dtype,
                                                             w1.dtype, w2.dtype)
        y = y[:T] if tb != T else y
        return y.to(x.dtype) if not gpu else y

    @staticmethod
    def backward(ctx, dy):
        saved = ctx.saved_tensors
        xin = saved[0]
        tb, T = xin.shape[0], ctx.tokens
        dy = dy.to(xin.dtype) if xin.device.type == "cuda" else dy
        if tb != T:
            dy = torch.cat([dy, dy.new_zeros(tb - T, dy.shape[1])])
        grads = _call(ctx.artifact, "moe_block_grad_backward", [*saved, dy])
        grads = [g.to(xin.device) for g in grads]
        grads[0] = grads[0][:T] if tb != T else grads[0]
        return (*[g.to(d) for g, d in zip(grads, ctx.dtypes)], None, None, None)


def _forward(block, hidden_states):
    batch, seq, hidden = hidden_states.shape
    x = hidden_states.reshape(-1, hidden)
    router_w = block.gate.weight.t()                 # [H, E]
    w1 = block.experts.gate_up_proj.transpose(1, 2)  # [E, H, 2F]: gate | up
    w2 = block.experts.down_proj.transpose(1, 2)     # [E, F, H]
    y = MoELayerFunction.apply(x, router_w, w1, w2, block.gate.top_k,
                               bool(block.gate.norm_topk_prob), block._moe_mlir_recipe)
    return y.reshape(batch, seq, hidden)


def patch(model, recipe="auto", artifacts=None):
    """Routes every Qwen3MoeSparseMoeBlock of `model` through moe-mlir;
    returns the number of blocks patched.

    recipe: "auto" (bf16 on GPUs, none on the CPU), "bf16", "mxfp8" (hidden
    and expert FFN multiples of 32) or "none" (f32 as written).
    artifacts: a folder of layers compiled with precompile() (needed where
    MLIR is not installed). The experts' gate_up_proj and down_proj keep
    their shapes and values, their storage is transposed in the last two
    dims (the layout the kernels read: no copy a step; .contiguous() gives
    transformers' layout back, as save_pretrained does). Raises TypeError if a block does not have the
    expected parameters (transformers' 3-D expert weights), ValueError for
    an unknown recipe."""
    if torch is None:
        raise ImportError("moe_mlir.torch.patch needs torch (pip install moe-mlir[torch])")
    _check_recipe(recipe)  # the name; each block's dims below
    if artifacts:
        if not os.path.isdir(artifacts):
            raise FileNotFoundError(f"artifacts: no folder {artifacts}")
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
        _check_recipe(recipe, gate.weight.shape[1], experts.down_proj.shape[-1])
        # The expert weights in the layout the kernels read: the same
        # parameters (shapes, values, optimizer references), their storage
        # transposed in the last two dims, so that the forward reads them in
        # place and their gradients accumulate without a copy.
        with torch.no_grad():
            for name in ("gate_up_proj", "down_proj"):
                p = getattr(experts, name)
                if not p.transpose(1, 2).is_contiguous():
                    p.data = p.data.transpose(1, 2).contiguous().transpose(1, 2)
        module._moe_mlir_recipe = recipe
        module.forward = types.MethodType(_forward, module)
        count += 1
    return count
