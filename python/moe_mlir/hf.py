"""Hugging Face transformers model directories, read and written with numpy
(no torch, no transformers needed).

    state = moe_mlir.hf.read_weights("Qwen3-30B-A3B/")   # {name: f32 array}
    moe_mlir.hf.write_model("out/", state, config, dtype="bfloat16",
                            max_shard_size="5GB", alphabet="protein")

Weights are read from ``model.safetensors`` or the shards named by
``model.safetensors.index.json``, in F32, BF16, F16 or F64, and returned in
f32 with transformers' names and layout ([out, in] matrices). Experts come
back fused as transformers 5 holds them in memory,
``mlp.experts.gate_up_proj`` [experts, 2 * ffn, hidden] (each expert's gate
rows, then its up rows) and ``mlp.experts.down_proj`` [experts, hidden, ffn],
whether the files store them fused or one tensor per expert and projection
(``mlp.experts.<e>.gate_proj.weight``: what the Hub serves and
``save_pretrained`` writes). ``write_model`` writes the per-expert layout,
so every transformers version and the other readers of the Hub's format
load the result.

``alphabet`` ("protein" or "dna") adds the tokenizer of moe-train's
alphabets (``tokenizer.json``, ``tokenizer_config.json``): ``<pad>`` 0,
``<bos>`` 1, ``<eos>`` 2, then one token per residue letter, lower case read
as upper, ambiguity codes mapped as moe-train maps them;
``AutoTokenizer.from_pretrained(out)`` loads it.
"""

import json
import os
import re
import struct

import numpy as np

try:
    import ml_dtypes
except ImportError:  # BF16 tensors then read as f32 and written from uint16
    ml_dtypes = None

__all__ = ["read_safetensors", "write_safetensors", "read_weights", "write_model",
           "tokenizer_files", "ALPHABETS"]

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
           "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
if ml_dtypes is not None:
    _DTYPES["BF16"] = ml_dtypes.bfloat16
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}

# moe-train's tokenizers (runtime/src/Sequences.cpp): the letters after
# <pad> <bos> <eos>, and what other letters are read as.
ALPHABETS = {
    "protein": ("ACDEFGHIKLMNPQRSTVWYX", {c: "X" for c in "BZUOJ*"}),
    "dna": ("ACGTN", dict({"U": "T"}, **{c: "N" for c in "RYSWKMBDHV"})),
}
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")

_EXPERT = re.compile(r"^(.*\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _dtype(name, path):
    if name == "BF16" and ml_dtypes is None:
        return np.uint16  # widened to f32 by read_safetensors
    if name not in _DTYPES:
        raise ValueError(f"{path}: dtype {name} is not supported")
    return _DTYPES[name]


def _bf16_bits(x):
    """f32 -> bf16 bit patterns (uint16), rounding to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def read_safetensors(path, keep=None):
    """({name: array in its stored dtype}, {metadata}) of a safetensors
    file, every header field checked against the file. With `keep` (a
    predicate on names) only the tensors it keeps are read."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: truncated, not even the header length")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise ValueError(f"{path}: truncated or corrupt, the header claims {length} bytes")
        try:
            header = json.loads(f.read(length))
        except ValueError as err:
            raise ValueError(f"{path}: corrupt header: {err}") from None
        if not isinstance(header, dict):
            raise ValueError(f"{path}: corrupt header: not a JSON object")
        data_size = size - 8 - length
        metadata = header.pop("__metadata__", None) or {}
        tensors = {}
        for name, entry in header.items():
            try:
                dtype = np.dtype(_dtype(entry["dtype"], path))
                shape = [int(d) for d in entry["shape"]]
                begin, end = (int(o) for o in entry["data_offsets"])
            except (KeyError, TypeError, ValueError) as err:
                if isinstance(err, ValueError) and "not supported" in str(err):
                    raise
                raise ValueError(f"{path}: corrupt header entry for '{name}'") from None
            count = int(np.prod(shape, dtype=np.int64))
            if min(shape, default=0) < 0 or not 0 <= begin <= end <= data_size \
                    or end - begin != count * dtype.itemsize:
                raise ValueError(f"{path}: tensor '{name}' lies outside the data or has "
                                 "another size than its shape")
            if keep is not None and not keep(name):
                continue
            f.seek(8 + length + begin)
            t = np.frombuffer(f.read(end - begin), dtype=dtype).reshape(shape)
            if entry["dtype"] == "BF16" and ml_dtypes is None:
                t = (t.astype(np.uint32) << 16).view(np.float32)
            tensors[name] = t
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None, bf16_bits=()):
    """Writes {name: array} (and string metadata) atomically: a temporary
    file beside `path`, renamed over it when complete. Tensors named in
    `bf16_bits` are uint16 arrays of bf16 bit patterns, written as BF16."""
    header, offset, arrays = {}, 0, []
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        bits = name in bf16_bits and array.dtype == np.uint16
        if array.dtype not in _NAMES and not bits:
            raise ValueError(f"tensor '{name}': dtype {array.dtype} cannot be written")
        header[name] = {"dtype": "BF16" if bits else _NAMES[array.dtype],
                        "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for array in arrays:
                f.write(array.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _files(model_dir):
    """The safetensors files of a model directory, with the tensors the
    index assigns to each (None: all)."""
    if not os.path.isdir(model_dir):
        raise ValueError(f"'{model_dir}' is not a directory (a transformers model directory "
                         "holds config.json and model.safetensors)")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            try:
                weight_map = json.load(f)["weight_map"]
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{index}: not an index with a \"weight_map\"") from None
        files = {}
        for name, file in weight_map.items():
            if not isinstance(file, str) or not file or "/" in file:
                raise ValueError(f"{index}: tensor '{name}' maps to no file of this directory")
            files.setdefault(file, set()).add(name)
        return [(os.path.join(model_dir, f), names) for f, names in sorted(files.items())]
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return [(single, None)]
    raise ValueError(f"{model_dir}: no model.safetensors or model.safetensors.index.json "
                     "(save the model with transformers' save_pretrained, which writes "
                     "safetensors)")


def read_weights(model_dir):
    """{transformers name: f32 array} of a model directory, experts fused
    (see the module's description). Refuses non-float tensors, NaN and
    infinities, and experts with a missing index or projection."""
    state = {}
    for path, names in _files(model_dir):
        tensors, _ = read_safetensors(path, None if names is None else names.__contains__)
        for name in names if names is not None else tensors:
            if name not in tensors:
                raise ValueError(f"{path}: no tensor '{name}' (the index names it)")
            t = tensors[name]
            if t.dtype.kind != "f" and t.dtype != _DTYPES.get("BF16"):
                raise ValueError(f"{path}: tensor '{name}' is {t.dtype}, not a float")
            t = t.astype(np.float32)
            if not np.all(np.isfinite(t)):
                raise ValueError(f"{path}: tensor '{name}' holds NaN or infinite values")
            state[name] = t
    # One tensor per expert and projection -> the fused experts.
    experts = {}
    for name in list(state):
        m = _EXPERT.match(name)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = state.pop(name)
    for prefix, parts in experts.items():
        count = 1 + max(e for e, _ in parts)
        for e in range(count):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                if (e, proj) not in parts:
                    raise ValueError(f"{model_dir}: no tensor '{prefix}{e}.{proj}.weight' "
                                     f"({count} experts)")
        if len(parts) != 3 * count:
            raise ValueError(f"{model_dir}: the experts of '{prefix}' are incomplete")
        state[prefix + "gate_up_proj"] = np.stack(
            [np.concatenate([parts[(e, "gate_proj")], parts[(e, "up_proj")]]) for e in range(count)])
        state[prefix + "down_proj"] = np.stack([parts[(e, "down_proj")] for e in range(count)])
    return state


def _bytes(size):
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)?\s*", str(size).upper())
    if not m:
        raise ValueError(f"max_shard_size {size!r}: expected bytes or a size like '5GB'")
    unit = m.group(2) or "B"
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    return int(float(m.group(1)) * scale)


def tokenizer_files(alphabet):
    """{file name: JSON object} of the tokenizer of a moe-train alphabet."""
    if alphabet not in ALPHABETS:
        raise ValueError(f"alphabet must be one of {', '.join(ALPHABETS)}, got {alphabet!r}")
    letters, mapped = ALPHABETS[alphabet]
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab.update({c: len(SPECIAL_TOKENS) + i for i, c in enumerate(letters)})
    replace = [{"type": "Replace", "pattern": {"Regex": r"\s"}, "content": ""}]
    replace += [{"type": "Replace", "pattern": {"String": c.lower()}, "content": c.upper()}
                for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    replace += [{"type": "Replace", "pattern": {"String": c}, "content": to}
                for c, to in mapped.items()]
    unknown = "X" if alphabet == "protein" else "N"
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(SPECIAL_TOKENS)]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": replace},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "<eos>", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<eos>", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "<eos>", "type_id": 1}}],
            "special_tokens": {t: {"id": t, "ids": [vocab[t]], "tokens": [t]}
                               for t in ("<bos>", "<eos>")}},
        "decoder": {"type": "Fuse"},
        # Characters, no merges: every residue its own token; anything else
        # the alphabet's unknown letter.
        "model": {"type": "BPE", "dropout": None, "unk_token": unknown,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>",
              "eos_token": "<eos>", "pad_token": "<pad>",
              "model_input_names": ["input_ids", "attention_mask"],
              "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config,
            "special_tokens_map.json": {"bos_token": "<bos>", "eos_token": "<eos>",
                                        "pad_token": "<pad>"}}


def write_model(out_dir, state, config, dtype="float32", max_shard_size="5GB", alphabet=None):
    """Writes a transformers model directory: the weights `state` ({name:
    array}, transformers' names and layout, experts fused or not) in
    `dtype` ("float32" or "bfloat16"), one ``model.safetensors`` or, above
    `max_shard_size` (bytes, or "5GB", "500MB"), shards with
    ``model.safetensors.index.json``; ``config.json`` (`config`, a dict,
    with the dtype and the architecture), ``generation_config.json`` and,
    with `alphabet`, the tokenizer files. Returns `out_dir`."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    limit = _bytes(max_shard_size)
    if limit < 1:
        raise ValueError(f"max_shard_size must be positive, got {max_shard_size!r}")
    tensors = {}
    for name in sorted(state):
        t = np.asarray(state[name], dtype=np.float32)
        if name.endswith(".experts.gate_up_proj") or name.endswith(".experts.down_proj"):
            prefix = name[: name.rindex(".") + 1]
            half = t.shape[1] // 2
            for e in range(t.shape[0]):
                if name.endswith("gate_up_proj"):
                    tensors[f"{prefix}{e}.gate_proj.weight"] = t[e, :half]
                    tensors[f"{prefix}{e}.up_proj.weight"] = t[e, half:]
                else:
                    tensors[f"{prefix}{e}.down_proj.weight"] = t[e]
        else:
            tensors[name] = t
    # bf16 by its bit patterns (rounded to nearest even, as ml_dtypes and
    # torch round), so no ml_dtypes is needed.
    convert = (lambda v: np.ascontiguousarray(v, dtype=np.float32)) if dtype == "float32" \
        else _bf16_bits
    tensors = {k: convert(v) for k, v in sorted(tensors.items())}
    bits = set(tensors) if dtype == "bfloat16" else set()
    # Shards in name order, each up to the limit (a larger tensor alone).
    shards, size = [[]], 0
    for name, t in tensors.items():
        if shards[-1] and size + t.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += t.nbytes
    os.makedirs(out_dir, exist_ok=True)
    for old in os.listdir(out_dir):  # weights of an earlier export would mix in
        if re.fullmatch(r"model(-\d+-of-\d+)?\.safetensors(\.index\.json)?", old):
            os.unlink(os.path.join(out_dir, old))
    weight_map = {}
    for i, names in enumerate(shards):
        file = "model.safetensors" if len(shards) == 1 else \
            f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(out_dir, file), {n: tensors[n] for n in names},
                          {"format": "pt"}, bf16_bits=bits)
        weight_map.update({n: file for n in names})
    if len(shards) > 1:
        total = sum(t.nbytes for t in tensors.values())
        _write_json(os.path.join(out_dir, "model.safetensors.index.json"),
                    {"metadata": {"total_size": total}, "weight_map": weight_map})

    config = dict(config)
    config.setdefault("model_type", "qwen3_moe")
    config.setdefault("architectures", ["Qwen3MoeForCausalLM"])
    config["torch_dtype"] = config["dtype"] = dtype
    generation = {}
    if alphabet is not None:
        files = tokenizer_files(alphabet)
        ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        config.update(ids)
        generation.update(ids)
        for file, content in files.items():
            _write_json(os.path.join(out_dir, file), content)
    _write_json(os.path.join(out_dir, "config.json"), config)
    _write_json(os.path.join(out_dir, "generation_config.json"), generation)
    return out_dir


def _write_json(path, content):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(content, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
