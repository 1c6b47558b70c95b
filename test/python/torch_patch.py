# RUN: %python %s
#
# moe_mlir.torch.patch on transformers' own Qwen3-MoE (tiny config, f32, CPU):
# a patched sparse block, and a whole patched causal LM, give the same outputs,
# loss and parameter gradients as the original, on the same weights.
# Tolerance: both compute in f32 with sums in a different order (torch's
# index_add per expert vs. moe-mlir's combine; BLAS vs. in-order matmuls):
# differences of a few f32 ulps of the largest terms, so relative 1e-4 on
# outputs and 1e-3 on gradients (which go through more sums).
# Then the patch's conventions: token counts bucketed (a count that is not a
# bucket pads rows that change nothing), compiled layers cached on disk and
# found again by a process that cannot compile (the package without its
# compiled extension, as on a GPU machine without MLIR), precompiled folders,
# the experts' storage in the kernels' layout, and its errors.
import copy
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

work = tempfile.mkdtemp(prefix="torch_patch_")
os.environ["MOE_MLIR_CACHE"] = os.path.join(work, "cache")

import moe_mlir.torch  # noqa: E402

torch.manual_seed(0)
config = Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                        num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                        vocab_size=50, norm_topk_prob=True, decoder_sparse_step=1,
                        mlp_only_layers=[])
model = Qwen3MoeForCausalLM(config).float()
for p in model.parameters():  # the experts start at zero/empty otherwise
    torch.nn.init.normal_(p, std=0.2)
patched = copy.deepcopy(model)
n = moe_mlir.torch.patch(patched)

failures = 0


def check(ok, what):
    global failures
    failures += not ok
    print(f"{'ok' if ok else 'FAIL'}: {what}")


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


check(n == 2, f"patched {n} sparse blocks")

# One block.
block, pblock = model.model.layers[0].mlp, patched.model.layers[0].mlp
x = torch.randn(3, 5, 32, requires_grad=True)
px = x.detach().clone().requires_grad_(True)
y, py = block(x), pblock(px)
check(rel(py, y) < 1e-4, f"block output (max rel diff {rel(py, y):.1e})")
dy = torch.randn_like(y)
y.backward(dy)
py.backward(dy)
check(rel(px.grad, x.grad) < 1e-3, f"block input gradient ({rel(px.grad, x.grad):.1e})")
for name, p in block.named_parameters():
    pp = dict(pblock.named_parameters())[name]
    check(rel(pp.grad, p.grad) < 1e-3, f"block gradient of {name} ({rel(pp.grad, p.grad):.1e})")

# The whole model: loss and every gradient.
model.zero_grad()
patched.zero_grad()
ids = torch.randint(0, 50, (2, 12))
loss = model(input_ids=ids, labels=ids).loss
ploss = patched(input_ids=ids, labels=ids).loss
check(abs(float(ploss - loss)) < 1e-5 * abs(float(loss)) + 1e-6,
      f"causal LM loss {float(loss):.6f} vs {float(ploss):.6f}")
loss.backward()
ploss.backward()
worst = max(rel(pp.grad, p.grad) for (_, p), (_, pp) in
            zip(model.named_parameters(), patched.named_parameters()) if p.grad is not None)
check(worst < 1e-3, f"every parameter gradient of the model (worst rel diff {worst:.1e})")

# Buckets: powers of two stay, others round up to a quarter of their octave.
buckets = [moe_mlir.torch.bucket(t) for t in (1, 15, 16, 17, 100, 2048, 2049, 3000, 16384)]
check(buckets == [16, 16, 16, 32, 112, 2048, 2560, 3072, 16384], f"buckets {buckets}")

# The storage of the patched experts: transposed, same values; the model
# saves and reloads through transformers unchanged.
w = patched.model.layers[0].mlp.experts.gate_up_proj
check(w.transpose(1, 2).is_contiguous() and torch.equal(
    w, model.model.layers[0].mlp.experts.gate_up_proj),
    "patched experts: the kernels' layout, the same values")
patched.save_pretrained(os.path.join(work, "saved"))
reloaded = Qwen3MoeForCausalLM.from_pretrained(os.path.join(work, "saved"))
check(all(torch.equal(a, b) for a, b in zip(patched.state_dict().values(),
                                            reloaded.state_dict().values())),
      "a patched model saves and reloads with the same weights")

# The on-disk cache holds every bucket this process compiled (15 tokens ->
# 16, 2 x 12 -> 32); another process without the compiled extension (the
# pure-Python package, so it cannot compile) finds them there, and also
# runs a layer precompiled into a folder.
cached = sorted(os.listdir(os.environ["MOE_MLIR_CACHE"]))
check(len(cached) == 2 and all(n.endswith(".cpu." + n.split(".")[-2] + ".so") for n in cached),
      f"cached layers: {cached}")
pre = os.path.join(work, "pre")
paths = moe_mlir.torch.precompile(pre, 32, 16, 4, 2, [40, 41], dtype="f32", recipe="none",
                                  target="cpu")
check(len(paths) == 1 and os.path.exists(paths[0]), "precompile: 40 and 41 tokens share a bucket")
src = os.path.dirname(moe_mlir.__file__)
script = f"""
import sys, types, importlib.util, os
spec = importlib.util.spec_from_file_location("moe_mlir", {os.path.join(src, "__init__.py")!r},
    submodule_search_locations=[{src!r}])
pkg = importlib.util.module_from_spec(spec); sys.modules["moe_mlir"] = pkg
spec.loader.exec_module(pkg)
sys.modules["moe_mlir._mlir"] = None  # no compiled extension: no compiling
import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
import moe_mlir.torch as mt
torch.manual_seed(1)
config = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=4,
                        num_experts_per_tok=2, norm_topk_prob=True)
block = Qwen3MoeSparseMoeBlock(config)
for p in block.parameters():
    torch.nn.init.normal_(p, std=0.2)
ref = Qwen3MoeSparseMoeBlock(config); ref.load_state_dict(block.state_dict())
mt.patch(block, artifacts={pre!r})
for t in (15, 40):
    x = torch.randn(1, t, 32)
    y, y0 = block(x), ref(x)
    assert float((y - y0).abs().max() / y0.abs().max()) < 1e-4, t
try:
    block(torch.randn(1, 64, 32))
except RuntimeError as err:
    assert "precompile" in str(err), err
    print("refused: " + str(err).split(";")[0])
else:
    raise SystemExit("a layer neither cached nor precompiled ran without a compiler")
"""
run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                     env=dict(os.environ, PYTHONPATH=""))
check(run.returncode == 0 and "refused: no compiled layer" in run.stdout,
      "without the compiler: cached and precompiled layers run, others are refused "
      f"({(run.stdout if run.returncode == 0 else run.stderr).strip().splitlines()[-1:]})")

# The command line: a config.json's layers at token counts, for a machine
# without MLIR; a config without the MoE fields is refused.
cfg = os.path.join(work, "config.json")
with open(cfg, "w") as f:
    json.dump(config.to_dict(), f)
cli = subprocess.run([sys.executable, "-m", "moe_mlir", "torch-precompile",
                      os.path.join(work, "cli"), "--config", cfg, "--tokens", "24", "30",
                      "--dtype", "f32", "--recipe", "none", "--target", "cpu"],
                     capture_output=True, text=True)
check(cli.returncode == 0 and len(os.listdir(os.path.join(work, "cli"))) == 1,
      f"torch-precompile: {cli.stdout.strip() or cli.stderr.strip()}")
with open(cfg, "w") as f:
    json.dump({"hidden_size": 32}, f)
cli = subprocess.run([sys.executable, "-m", "moe_mlir", "torch-precompile",
                      os.path.join(work, "cli2"), "--config", cfg, "--tokens", "24"],
                     capture_output=True, text=True)
check(cli.returncode == 1 and "moe_intermediate_size" in cli.stderr,
      f"torch-precompile refuses a config without the MoE fields: {cli.stderr.strip()}")

# Errors.
for kwargs, error in (({"recipe": "fp4"}, ValueError),
                      ({"artifacts": os.path.join(work, "missing")}, FileNotFoundError)):
    try:
        moe_mlir.torch.patch(copy.deepcopy(model), **kwargs)
    except error as err:
        check(True, f"patch({kwargs}) refused: {err}")
    else:
        check(False, f"patch({kwargs}) accepted")
try:
    moe_mlir.torch.patch(copy.deepcopy(model), recipe="mxfp8")
except ValueError as err:
    check("multiples of 32" in str(err), f"recipe mxfp8 at expert FFN 16 refused: {err}")
else:
    check(False, "recipe mxfp8 accepted at expert FFN 16")
cpu_bf16 = copy.deepcopy(model)
moe_mlir.torch.patch(cpu_bf16, recipe="bf16")
try:
    cpu_bf16(input_ids=ids)
except ValueError as err:
    check("CUDA" in str(err), f"recipe bf16 on CPU tensors refused: {err}")
else:
    check(False, "recipe bf16 ran on CPU tensors")
sys.exit(1 if failures else 0)
