"""MoE language models from a Hugging Face config.json, trained from Python.

    model = moe_mlir.models.LanguageModel("config.json", batch=8, seq=128)
    params = model.init(seed=0)                    # {hf name: numpy array}
    # or from a transformers model directory (config.json + safetensors):
    model, params = LanguageModel.from_pretrained("Qwen3-MoE-dir/", batch=8, seq=128)
    opt = moe_mlir.models.AdamW(params, lr=3e-3)
    for ids, labels in batches:                    # int32 [batch, seq] each
        loss, grads = model.loss_grad(params, ids, labels)
        opt.step(params, grads)

The graph is the one moe-model and moe-train build (Qwen3-MoE family:
embedding, RMSNorm, grouped-query attention with q/k norms and rotary
embeddings, MoE or dense SwiGLU MLPs, LM head, next-token cross-entropy);
its train step comes from -moe-autodiff; it is compiled for the CPU or a GPU
chip on construction. Parameters are numpy f32 arrays keyed by their
transformers names, in our layout ([in, out]); ``to_hf`` / ``from_hf`` swap
the last two dimensions where transformers stores [out, in]. Labels of -100
(or any value outside the vocabulary) are ignored by the loss.

``document_mask=True`` builds the model whose attention stays within
documents: ``loss`` and ``loss_grad`` then take ``documents``, int32
[batch, seq], the document of each token of the packed rows (a query sees
the keys of its own document only; ``documents_from_bos`` numbers them as
moe-train does). ``layer_functions=True`` compiles each kind of decoder
layer once, as a function called per layer (the same results; compile time
follows the kinds of layers, not the depth).
"""

import json
import os
import tempfile

import numpy as np

from ._errors import MLIRError

__all__ = ["LanguageModel", "AdamW", "export_hf"]


class LanguageModel:
    def __init__(self, config, batch, seq, target="cpu", workdir=None,
                 document_mask=False, layer_functions=False):
        if isinstance(config, dict):
            text, source = json.dumps(config), "<config dict>"
        else:
            source = os.fspath(config)
            with open(source) as f:
                text = f.read()
        self.config = json.loads(text)
        self.batch, self.seq, self.target = batch, seq, target
        self.document_mask = bool(document_mask)
        from . import Module
        from .runtime import load
        module = Module.language_model(text, source, batch, seq,
                                       document_mask=self.document_mask,
                                       layer_functions=bool(layer_functions))
        module.run("builtin.module(moe-autodiff)")
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="moe-model-")
            workdir = self._tmp.name
        self.artifact_path = os.path.join(workdir, f"train_step-{target}.so")
        module.compile(target, self.artifact_path)
        self._artifact = load(self.artifact_path)
        args, _ = self._artifact.functions["loss_grad"]
        self.parameters = [a for a in args if a.param]
        self.names = [a.param for a in self.parameters]

    @classmethod
    def from_pretrained(cls, model_dir, batch, seq, target="cpu", workdir=None,
                        **options):
        """The model of a transformers model directory (its config.json) and
        its weights in our layout: ``(model, params)``. The weights are read
        by moe_mlir.hf.read_weights (single file or sharded; F32, BF16, F16;
        experts fused or one tensor per expert)."""
        from . import hf

        model = cls(os.path.join(model_dir, "config.json"), batch, seq, target=target,
                    workdir=workdir, **options)
        return model, model.from_hf(hf.read_weights(model_dir))

    # --- parameters ---
    def init(self, seed=0):
        """Norm weights 1, everything else normal(0, initializer_range)."""
        rng = np.random.default_rng(seed)
        std = float(self.config.get("initializer_range", 0.02))
        return {a.param: (np.ones(a.shape, np.float32) if a.init == "ones" else
                          (rng.standard_normal(a.shape) * std).astype(np.float32))
                for a in self.parameters}

    def to_hf(self, params):
        """Our layout -> transformers' (numpy arrays, same names)."""
        return {a.param: np.ascontiguousarray(np.swapaxes(params[a.param], -1, -2)
                                              if a.hf_transposed else params[a.param])
                for a in self.parameters}

    def from_hf(self, state):
        """transformers' tensors (numpy or torch) -> our layout."""
        out = {}
        for a in self.parameters:
            if a.param not in state:
                raise KeyError(f"no '{a.param}' in the state dict"
                               + (" (tied to the embedding? 'tie_word_embeddings' in "
                                  "config.json)" if a.param == "lm_head.weight" else ""))
            t = state[a.param]
            t = t.detach().cpu().float().numpy() if hasattr(t, "detach") else np.asarray(t)
            t = np.swapaxes(t, -1, -2) if a.hf_transposed else t
            if t.shape != a.shape:
                raise ValueError(f"'{a.param}' has shape {t.shape}, the model expects {a.shape}")
            out[a.param] = np.ascontiguousarray(t, dtype=np.float32)
        return out

    # --- forward and backward ---
    def _args(self, params, ids, labels, router_bias=None, documents=None):
        missing = [n for n in self.names if n not in params]
        if missing:
            raise KeyError(f"missing parameters: {', '.join(missing[:3])}")
        def array(what, value, shape, dtype=np.int32):
            a = np.ascontiguousarray(value, dtype=dtype)
            if a.shape != tuple(shape):
                raise ValueError(f"{what} must be {list(shape)}, got {list(a.shape)}")
            return a

        rows = (self.batch, self.seq)
        args = [params[n] for n in self.names] + [array("ids", ids, rows),
                                                  array("labels", labels, rows)]
        # The routers' selection bias (config 'router_bias_update_rate'):
        # zeros unless given.
        spec = self._artifact.functions["loss_grad"][0][len(self.names) + 2:]
        if spec and spec[0].input == "router_bias":
            args.append(np.zeros(spec[0].shape, np.float32) if router_bias is None else
                        array("router_bias", router_bias, spec[0].shape, np.float32))
        elif router_bias is not None:
            raise ValueError("this model has no router bias ('router_bias_update_rate' "
                             "is not set in its config)")
        if self.document_mask:
            if documents is None:
                raise ValueError("this model masks attention within documents "
                                 "(document_mask=True): pass documents, int32 "
                                 f"[{self.batch}, {self.seq}]")
            args.append(array("documents", documents, rows))
        elif documents is not None:
            raise ValueError("this model has no document mask (build it with "
                             "document_mask=True)")
        return args

    @staticmethod
    def documents_from_bos(ids, bos):
        """Each token's document in its packed row, as moe-train numbers
        them: the count of `bos` tokens up to and including it."""
        ids = np.asarray(ids)
        return np.cumsum(ids == bos, axis=-1).astype(np.int32)

    def loss(self, params, ids, labels, router_bias=None, documents=None):
        out = self._artifact.loss(*self._args(params, ids, labels, router_bias,
                                              documents))
        return float(out[0] if isinstance(out, (tuple, list)) else out)

    def loss_grad(self, params, ids, labels, outputs=False, router_bias=None,
                  documents=None):
        """The loss and {name: gradient}; with `outputs`, also the graph's
        outputs by name ({"expert_load": int32 [MoE layers, experts]}, the
        top-k assignments each expert got). `router_bias` [MoE layers,
        experts]: the routers' selection bias of models with
        'router_bias_update_rate' (zeros by default). `documents` [batch,
        seq]: each token's document, for a model built with
        document_mask=True."""
        out = self._artifact.loss_grad(*self._args(params, ids, labels, router_bias,
                                                   documents))
        n = len(self.names)
        grads = dict(zip(self.names, out[1:1 + n], strict=True))
        if not outputs:
            return float(out[0]), grads
        _, results = self._artifact.functions["loss_grad"]
        named = {r.output: v for r, v in zip(results[1 + n:], out[1 + n:], strict=True)}
        return float(out[0]), grads, named

    @staticmethod
    def next_token_labels(ids, pad=0):
        """Labels for next-token prediction: ids shifted left by one, -100
        at the end of every row and where the next token is `pad`."""
        ids = np.asarray(ids)
        labels = np.full(ids.shape, -100, np.int32)
        labels[:, :-1] = ids[:, 1:]
        labels[:, :-1][ids[:, 1:] == pad] = -100
        return labels


class AdamW:
    """torch.optim.AdamW on numpy arrays (decoupled weight decay on
    parameters of two or more dimensions), with optional clipping by global
    norm."""

    def __init__(self, params, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                 clip=1.0):
        self.lr, self.betas, self.eps, self.wd, self.clip = lr, betas, eps, weight_decay, clip
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, params, grads, lr=None):
        """Updates `params` in place; returns the gradients' global norm."""
        lr = self.lr if lr is None else lr
        norm = float(np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())))
        scale = self.clip / (norm + 1e-6) if self.clip and norm > self.clip else 1.0
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for k, p in params.items():
            g = grads[k] * np.float32(scale)
            if self.wd and p.ndim >= 2:
                p *= np.float32(1 - lr * self.wd)
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            p -= np.float32(lr / c1) * self.m[k] / (np.sqrt(self.v[k]) / np.float32(np.sqrt(c2)) + np.float32(self.eps))
        return norm


def _latest_checkpoint(run_dir):
    """The checkpoint of a run directory: checkpoint.safetensors (one rank)
    or checkpoint.index.json (one file per rank), whichever is newer."""
    paths = [os.path.join(run_dir, n) for n in ("checkpoint.safetensors", "checkpoint.index.json")]
    found = [p for p in paths if os.path.isfile(p)]
    return max(found, key=lambda p: os.stat(p).st_mtime_ns) if found else paths[0]


def _read_checkpoint(path, keep=None):
    """({name: array}, {metadata}) of a moe-train checkpoint: one file, or the
    files an index names merged (a tensor in several files is split along its
    first dimension over the ranks that wrote them, in file order)."""
    from . import hf

    if not path.endswith(".index.json"):
        return hf.read_safetensors(path, keep=keep)
    with open(path) as f:
        index = json.load(f)
    if (not isinstance(index, dict) or index.get("format") != "moe-train-index/1"
            or not isinstance(index.get("files"), list) or not index["files"]):
        raise ValueError(f"{path}: not a moe-train checkpoint index")
    parts, meta = {}, None
    for name in index["files"]:
        if not isinstance(name, str) or "/" in name:
            raise ValueError(f"{path}: 'files' holds names of files beside the index")
        tensors, file_meta = hf.read_safetensors(
            os.path.join(os.path.dirname(path), name), keep=keep)
        if file_meta.get("step") != str(index.get("step")):
            raise ValueError(f"{path}: {name} holds step {file_meta.get('step')}, the index "
                             f"step {index.get('step')} (files of another checkpoint)")
        meta = meta or file_meta
        for key, value in tensors.items():
            parts.setdefault(key, []).append(value)
    merged = {k: v[0] if len(v) == 1 else np.concatenate(v, axis=0) for k, v in parts.items()}
    return merged, meta


def export_hf(checkpoint, config=None, out_dir=None, dtype="float32", max_shard_size="5GB",
              alphabet=None):
    """Writes a moe-train checkpoint as a transformers model directory
    (moe_mlir.hf.write_model: the parameters in transformers' layout without
    the optimizer state, experts one tensor per expert, ``dtype`` "float32"
    or "bfloat16", sharded above ``max_shard_size``; config.json,
    generation_config.json and the tokenizer of the run's alphabet), loadable
    with ``AutoModelForCausalLM.from_pretrained(out_dir)`` and
    ``AutoTokenizer.from_pretrained(out_dir)``. `checkpoint` is a
    checkpoint.safetensors, the checkpoint.index.json of a run on several
    ranks (their files merged), or the run directory holding either; `config` the
    config.json (path or dict) the run trained, by default the one of the
    run's --init-from directory; `alphabet` by default the run's."""
    from . import hf

    if out_dir is None:
        raise TypeError("export_hf needs out_dir")
    if os.path.isdir(checkpoint):
        checkpoint = _latest_checkpoint(checkpoint)
    if not os.path.isfile(checkpoint):
        raise ValueError(f"{checkpoint}: no moe-train checkpoint (give a run directory, its "
                         "checkpoint.safetensors or its checkpoint.index.json)")
    # The parameters only: not the optimizer's moments (read for nothing,
    # twice the parameters' size), nor the routers' selection bias, which
    # transformers' Qwen3-MoE does not have.
    tensors, meta = _read_checkpoint(
        checkpoint, keep=lambda name: not name.startswith(("optimizer.", "router.")))
    if meta.get("format") != "moe-train/1" or "hf_transposed" not in meta:
        raise ValueError(f"{checkpoint} is not a moe-train checkpoint with layout "
                         "information (written by moe-train / moert-train)")
    transposed = set(filter(None, meta["hf_transposed"].split(",")))
    state = {name: np.swapaxes(t, -1, -2) if name in transposed else t
             for name, t in tensors.items()}
    if config is None:
        # A run started with --init-from records the directory.
        config = os.path.join(meta.get("init_from", ""), "config.json")
        if "init_from" not in meta or not os.path.exists(config):
            raise ValueError(f"{checkpoint}: give the config.json the run trained (the "
                             "checkpoint names no --init-from directory holding one)")
    if not isinstance(config, dict):
        with open(config) as cf:
            config = json.load(cf)
    return hf.write_model(out_dir, state, config, dtype=dtype, max_shard_size=max_shard_size,
                          alphabet=alphabet or meta.get("alphabet"))
