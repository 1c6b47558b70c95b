# RUN: %python %s
#
# Whole models from Python: a Qwen3-MoE-style config (a dict) becomes a
# compiled train step; parameters initialized, trained with the numpy AdamW
# (checked against torch.optim.AdamW) on globin sequences from Debian's
# hmmer-examples: the loss falls. Layout conversion to and from
# transformers' round-trips; bad configs and bad batches raise errors that
# name what is wrong.
import sys

import numpy as np
import torch

from moe_mlir import MLIRError
from moe_mlir.models import AdamW, LanguageModel
from checks import check, finish



cfg = {"model_type": "qwen3_moe", "hidden_size": 32, "moe_intermediate_size": 16,
       "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 1,
       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 24,
       "rope_theta": 10000.0}
B, S = 4, 32
model = LanguageModel(cfg, batch=B, seq=S)
check(model.names[0] == "model.embed_tokens.weight" and model.names[-1] == "lm_head.weight"
      and len(model.names) == 14, f"{len(model.names)} parameters, by transformers name")
params = model.init(seed=1)
check(all(params[n].dtype == np.float32 for n in model.names)
      and np.all(params["model.norm.weight"] == 1.0), "initialized: norms 1, f32")
back = model.from_hf(model.to_hf(params))
check(all(np.array_equal(back[n], params[n]) for n in model.names)
      and model.to_hf(params)["lm_head.weight"].shape == (24, 32),
      "to_hf / from_hf round-trip ([out, in] on transformers' side)")

# Sequences: the 45 globins, tokenized as moe-train does (<bos> residues <eos>).
letters = "ACDEFGHIKLMNPQRSTVWYX"
seqs, cur = [], []
for line in open("/usr/share/doc/hmmer/examples/tutorial/globins45.fa"):
    if line.startswith(">"):
        if cur:
            seqs.append("".join(cur))
        cur = []
    else:
        cur.append(line.strip().upper())
seqs.append("".join(cur))
tokens = []
for s in seqs:
    tokens += [1] + [letters.index(c) + 3 if c in letters else 23 for c in s] + [2]
rows = np.array(tokens[: (len(tokens) // (S + 1)) * (S + 1)], np.int32).reshape(-1, S + 1)
rng = np.random.default_rng(0)

opt = AdamW(params, lr=1e-2, weight_decay=0.0)
losses = []
for step in range(40):
    pick = rows[rng.integers(0, len(rows), B)]
    ids, labels = pick[:, :-1], pick[:, 1:]
    loss, grads = model.loss_grad(params, ids, labels)
    opt.step(params, grads)
    losses.append(loss)
check(np.mean(losses[-5:]) < losses[0] - 0.5,
      f"40 AdamW steps: the loss falls from {losses[0]:.3f} to {np.mean(losses[-5:]):.3f}")
check(abs(model.loss(params, ids, labels) - model.loss_grad(params, ids, labels)[0]) == 0,
      "loss() is loss_grad()'s loss")
labels = LanguageModel.next_token_labels(np.array([[1, 5, 6, 2, 0, 0]]))
check(labels.tolist() == [[5, 6, 2, -100, -100, -100]], "next_token_labels masks padding")

# The numpy AdamW is torch's (3 steps, weight decay and clipping on).
p = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float32)}
tp = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in p.items()}
ours = AdamW(p, lr=0.05, weight_decay=0.1, clip=0.5)
theirs = torch.optim.AdamW([{"params": [tp["w"]], "weight_decay": 0.1},
                            {"params": [tp["b"]], "weight_decay": 0.0}], lr=0.05, betas=(0.9, 0.95))
for t in range(3):
    g = {"w": np.sin(np.arange(12, dtype=np.float32) + t).reshape(3, 4), "b": np.cos(np.arange(4, dtype=np.float32) * t)}
    ours.step(p, g)
    for k in g:
        tp[k].grad = torch.tensor(g[k])
    torch.nn.utils.clip_grad_norm_(list(tp.values()), 0.5)
    theirs.step()
err = max(float(np.max(np.abs(p[k] - tp[k].detach().numpy()))) for k in p)
check(err < 1e-6, f"AdamW matches torch.optim.AdamW with clipping and decay (max diff {err:.1e})")

# Options: layer functions give the same losses and gradients; with a
# document mask a token sees its own document only. The rows hold document
# B (ids perturbed below), then document A, the only one with labels:
# masked, A's loss ignores B's ids; unmasked it does not.
ids = pick[:, :-1].copy()
ids[:, 0] = 1
ids[:, S // 2] = 1  # <bos>: A starts in the middle of each row
docs = LanguageModel.documents_from_bos(ids, bos=1)
check(docs[0, 0] == 1 and docs[0, S // 2 - 1] == 1 and docs[0, S // 2] == 2,
      "documents_from_bos numbers the documents of a row as moe-train does")
labels = pick[:, 1:].copy()
labels[:, : S // 2] = -100
other = ids.copy()
other[:, 1 : S // 2] = (other[:, 1 : S // 2] + 5) % 24
loss_flat, grads_flat = model.loss_grad(params, ids, labels)
functions = LanguageModel(cfg, batch=B, seq=S, layer_functions=True)
loss_fn, grads_fn = functions.loss_grad(params, ids, labels)
check(loss_fn == loss_flat and all(np.array_equal(grads_fn[n], grads_flat[n]) for n in model.names),
      "layer_functions=True: the same loss and gradients, bit for bit")
masked = LanguageModel(cfg, batch=B, seq=S, document_mask=True, layer_functions=True)
same = masked.loss(params, ids, labels, documents=docs) == masked.loss(params, other, labels, documents=docs)
moved = model.loss(params, ids, labels) != model.loss(params, other, labels)
check(same and moved, "document_mask=True: a document's loss does not see the "
      "document before it (without the mask it does)")
one = np.ones((B, S), np.int32)
check(masked.loss(params, ids, labels, documents=one) == model.loss(params, ids, labels),
      "document_mask=True with one document per row is the unmasked loss")
try:
    masked.loss(params, ids, labels)
    check(False, "a masked model without documents raises")
except ValueError as e:
    check("pass documents" in str(e), "a masked model without documents raises ValueError")

# Errors.
try:
    LanguageModel(dict(cfg, num_experts_per_tok=9), batch=B, seq=S)
    check(False, "a bad config raises")
except MLIRError as e:
    check("'num_experts_per_tok' (9) exceeds 'num_experts' (4)" in str(e),
          "a bad config raises MLIRError naming the fields")
try:
    model.loss(params, ids[:, :8], labels)
    check(False, "a bad batch raises")
except ValueError as e:
    check("ids must be [4, 32]" in str(e), "a batch of the wrong shape raises ValueError")
finish()
