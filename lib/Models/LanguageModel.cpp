//===- LanguageModel.cpp - MoE language models from a config --------------===//

#include "moe/Models/LanguageModel.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CheckedArithmetic.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

using namespace mlir;
using namespace mlir::moe;

//===----------------------------------------------------------------------===//
// config.json
//===----------------------------------------------------------------------===//

namespace {
/// Reads the fields of one JSON object, collecting the first error.
struct FieldReader {
  const llvm::json::Object &object;
  std::string error;

  bool failed() const { return !error.empty(); }
  void fail(const llvm::Twine &message) {
    if (error.empty())
      error = message.str();
  }
  static std::string show(const llvm::json::Value &v) {
    std::string s;
    llvm::raw_string_ostream os(s);
    os << v;
    return s;
  }

  /// A positive integer field; `fallback` if absent (0: required).
  int64_t positive(llvm::StringRef key, int64_t fallback = 0) {
    const llvm::json::Value *v = object.get(key);
    if (!v || v->kind() == llvm::json::Value::Null) {
      if (!fallback)
        fail("config has no '" + key + "' (a positive integer)");
      return fallback;
    }
    std::optional<int64_t> i = v->getAsInteger();
    if (!i || *i < 1) {
      fail("'" + key + "' must be a positive integer, got " + show(*v));
      return fallback ? fallback : 1;
    }
    if (*i > (int64_t(1) << 31)) {
      fail("'" + key + "' is " + llvm::Twine(*i) + ", more than 2^31");
      return 1;
    }
    return *i;
  }
  double number(llvm::StringRef key, double fallback, bool positiveOnly) {
    const llvm::json::Value *v = object.get(key);
    if (!v || v->kind() == llvm::json::Value::Null)
      return fallback;
    std::optional<double> d = v->getAsNumber();
    if (!d || !std::isfinite(*d) || *d < 0 || (positiveOnly && *d == 0)) {
      fail("'" + key + "' must be a " +
           (positiveOnly ? "positive" : "non-negative") + " number, got " +
           show(*v));
      return fallback;
    }
    return *d;
  }
  bool boolean(llvm::StringRef key, bool fallback) {
    const llvm::json::Value *v = object.get(key);
    if (!v || v->kind() == llvm::json::Value::Null)
      return fallback;
    std::optional<bool> b = v->getAsBoolean();
    if (!b) {
      fail("'" + key + "' must be true or false, got " + show(*v));
      return fallback;
    }
    return *b;
  }
};
} // namespace

/// Whether `json` nests arrays and objects deeper than `limit` (strings
/// skipped). llvm::json::parse recurses once per level: a deep enough input
/// would overflow the stack.
static bool nestsDeeperThan(llvm::StringRef json, int limit) {
  int depth = 0;
  bool inString = false, escaped = false;
  for (char c : json) {
    if (inString) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        inString = false;
      continue;
    }
    if (c == '"')
      inString = true;
    else if (c == '[' || c == '{') {
      if (++depth > limit)
        return true;
    } else if (c == ']' || c == '}')
      --depth;
  }
  return false;
}

llvm::Expected<ModelConfig> ModelConfig::parse(llvm::StringRef json,
                                               llvm::StringRef source) {
  auto make = [&](const llvm::Twine &message) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   (source + ": " + message).str());
  };
  // A config.json nests a few levels; far deeper input is refused unread.
  constexpr int kMaxNesting = 64;
  if (nestsDeeperThan(json, kMaxNesting))
    return make("not valid JSON: nested more than " + llvm::Twine(kMaxNesting) +
                " levels deep");
  llvm::Expected<llvm::json::Value> value = llvm::json::parse(json);
  if (!value)
    return make("not valid JSON: " + llvm::toString(value.takeError()));
  const llvm::json::Object *object = value->getAsObject();
  if (!object)
    return make("expects a JSON object (a Hugging Face config.json)");

  FieldReader r{*object, {}};
  if (const llvm::json::Value *t = object->get("model_type")) {
    std::optional<llvm::StringRef> s = t->getAsString();
    if (!s || *s != "qwen3_moe")
      r.fail("'model_type' is " + FieldReader::show(*t) +
             ": only \"qwen3_moe\" models are built");
  }
  ModelConfig c;
  c.hiddenSize = r.positive("hidden_size");
  c.moeIntermediateSize = r.positive("moe_intermediate_size");
  // transformers 5 writes 'num_local_experts' (4.x: 'num_experts').
  bool local = !object->get("num_experts") && object->get("num_local_experts");
  c.numExperts = r.positive(local ? "num_local_experts" : "num_experts");
  if (!local && object->get("num_local_experts") && !r.failed()) {
    std::optional<int64_t> other =
        object->get("num_local_experts")->getAsInteger();
    if (!other || *other != c.numExperts)
      r.fail("'num_local_experts' (" +
             FieldReader::show(*object->get("num_local_experts")) +
             ") and 'num_experts' (" + llvm::Twine(c.numExperts) +
             ") disagree");
  }
  c.numExpertsPerTok = r.positive("num_experts_per_tok");
  c.numHiddenLayers = r.positive("num_hidden_layers");
  c.numAttentionHeads = r.positive("num_attention_heads");
  c.numKeyValueHeads = r.positive("num_key_value_heads", c.numAttentionHeads);
  c.vocabSize = r.positive("vocab_size");
  if (r.failed())
    return make(r.error);
  // Sizes far beyond any model that would build in memory are refused
  // before anything is built for them.
  for (auto [key, value, limit] :
       {std::tuple<const char *, int64_t, int64_t>{"num_hidden_layers",
                                                   c.numHiddenLayers, 4096},
        {"num_experts", c.numExperts, 1 << 16},
        {"num_attention_heads", c.numAttentionHeads, 1 << 12}})
    if (value > limit)
      return make(llvm::Twine("'") + key + "' is " + llvm::Twine(value) +
                  ", more than " + llvm::Twine(limit) + " is not supported");
  c.headDim = r.positive(
      "head_dim", std::max<int64_t>(1, c.hiddenSize / c.numAttentionHeads));
  c.decoderSparseStep = r.positive("decoder_sparse_step", 1);
  c.sharedExpertIntermediateSize = 0;
  if (object->get("shared_expert_intermediate_size") &&
      object->get("shared_expert_intermediate_size")->kind() !=
          llvm::json::Value::Null) {
    const llvm::json::Value *v = object->get("shared_expert_intermediate_size");
    std::optional<int64_t> i = v->getAsInteger();
    if (!i || *i < 0 || *i > (int64_t(1) << 31))
      r.fail("'shared_expert_intermediate_size' must be a non-negative "
             "integer, got " +
             FieldReader::show(*v));
    else
      c.sharedExpertIntermediateSize = *i;
  }
  c.normTopkProb = r.boolean("norm_topk_prob", true);
  c.tieWordEmbeddings = r.boolean("tie_word_embeddings", false);
  c.rmsNormEps = r.number("rms_norm_eps", 1e-6, /*positiveOnly=*/false);
  c.ropeTheta = r.number("rope_theta", 1e6, /*positiveOnly=*/true);
  // transformers 5: {"rope_theta": .., "rope_type": "default"}.
  if (const llvm::json::Value *v = object->get("rope_parameters");
      v && v->kind() != llvm::json::Value::Null) {
    const llvm::json::Object *rope = v->getAsObject();
    if (!rope) {
      r.fail("'rope_parameters' must be an object, got " +
             FieldReader::show(*v));
    } else {
      if (const llvm::json::Value *type = rope->get("rope_type");
          type && type->kind() != llvm::json::Value::Null &&
          type->getAsString() != std::optional<llvm::StringRef>("default"))
        r.fail("'rope_parameters' has rope_type " + FieldReader::show(*type) +
               ": only plain rotary embeddings (\"default\") are supported");
      FieldReader inner{*rope, {}};
      double theta = inner.number("rope_theta", c.ropeTheta, true);
      if (inner.failed())
        r.fail("'rope_parameters': " + inner.error);
      else if (object->get("rope_theta") && theta != c.ropeTheta)
        r.fail("'rope_theta' (" + std::to_string(c.ropeTheta) +
               ") and 'rope_parameters.rope_theta' (" + std::to_string(theta) +
               ") disagree");
      c.ropeTheta = theta;
    }
  }
  if (r.boolean("use_sliding_window", false))
    r.fail("'use_sliding_window' is true: sliding-window attention is not "
           "supported");
  c.initializerRange =
      r.number("initializer_range", 0.02, /*positiveOnly=*/false);
  // transformers adds the load-balancing loss only with router logits out.
  double auxCoef = r.number("router_aux_loss_coef", 0.001, false);
  c.routerAuxLossCoef = r.boolean("output_router_logits", false) ? auxCoef : 0;
  c.routerZLossCoef = r.number("router_z_loss_coef", 0, false);
  c.routerBiasUpdateRate = r.number("router_bias_update_rate", 0, false);
  if (r.boolean("attention_bias", false))
    r.fail("'attention_bias' is true: attention projections with a bias are "
           "not supported");
  if (const llvm::json::Value *v = object->get("rope_scaling");
      v && v->kind() != llvm::json::Value::Null)
    r.fail("'rope_scaling' is " + FieldReader::show(*v) +
           ": only plain rotary embeddings (rope_scaling null) are supported");
  if (const llvm::json::Value *v = object->get("hidden_act")) {
    std::optional<llvm::StringRef> s = v->getAsString();
    if (!s || *s != "silu")
      r.fail("'hidden_act' is " + FieldReader::show(*v) +
             ": the MLPs are SwiGLU (\"silu\")");
  }
  if (const llvm::json::Value *v = object->get("mlp_only_layers");
      v && v->kind() != llvm::json::Value::Null) {
    const llvm::json::Array *a = v->getAsArray();
    if (!a)
      r.fail("'mlp_only_layers' must be a list of layer indices, got " +
             FieldReader::show(*v));
    else
      for (const llvm::json::Value &e : *a) {
        std::optional<int64_t> i = e.getAsInteger();
        if (!i || *i < 0 || *i >= c.numHiddenLayers) {
          r.fail("'mlp_only_layers' holds " + FieldReader::show(e) +
                 ", not a layer index in [0, " +
                 llvm::Twine(c.numHiddenLayers) + ")");
          break;
        }
        c.mlpOnlyLayers.push_back(*i);
      }
  }
  if (r.failed())
    return make(r.error);

  if (c.numExpertsPerTok > c.numExperts)
    return make("'num_experts_per_tok' (" + llvm::Twine(c.numExpertsPerTok) +
                ") exceeds 'num_experts' (" + llvm::Twine(c.numExperts) + ")");
  if (c.numAttentionHeads % c.numKeyValueHeads)
    return make("'num_attention_heads' (" + llvm::Twine(c.numAttentionHeads) +
                ") must be a multiple of 'num_key_value_heads' (" +
                llvm::Twine(c.numKeyValueHeads) + ")");
  if (c.headDim % 2)
    return make("'head_dim' (" + llvm::Twine(c.headDim) +
                ") must be even (rotary embeddings rotate pairs)");
  bool anyDense = false;
  for (int64_t i = 0; i < c.numHiddenLayers; ++i)
    anyDense |= !c.isMoELayer(i);
  if (anyDense) {
    FieldReader dense{*object, {}};
    c.intermediateSize = dense.positive("intermediate_size");
    if (dense.failed())
      return make(dense.error +
                  " (layers without experts, from 'decoder_sparse_step' or "
                  "'mlp_only_layers', are dense MLPs of that size)");
  }
  // Every parameter's element count must fit in int64_t.
  for (const ModelParameter &p : modelParameters(c)) {
    int64_t n = 1;
    for (int64_t d : p.shape) {
      std::optional<int64_t> m = llvm::checkedMul(n, d);
      if (!m)
        return make("parameter '" + p.name + "' is too large");
      n = *m;
    }
  }
  return c;
}

llvm::Expected<ModelConfig> ModelConfig::load(llvm::StringRef path) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer)
    return llvm::createStringError(buffer.getError(),
                                   "cannot read '" + path.str() +
                                       "': " + buffer.getError().message());
  return parse((*buffer)->getBuffer(), path);
}

bool ModelConfig::isMoELayer(int64_t layer) const {
  if (llvm::is_contained(mlpOnlyLayers, layer))
    return false;
  return (layer + 1) % decoderSparseStep == 0;
}

std::string ModelConfig::fingerprint() const {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "hidden=" << hiddenSize << ",moe_ffn=" << moeIntermediateSize
     << ",experts=" << numExperts << ",top_k=" << numExpertsPerTok
     << ",layers=" << numHiddenLayers << ",heads=" << numAttentionHeads
     << ",kv_heads=" << numKeyValueHeads << ",head_dim=" << headDim
     << ",vocab=" << vocabSize << ",ffn=" << intermediateSize
     << ",sparse_step=" << decoderSparseStep << ",mlp_only=";
  for (auto [i, l] : llvm::enumerate(mlpOnlyLayers))
    os << (i ? ":" : "") << l;
  os << ",shared=" << sharedExpertIntermediateSize
     << ",norm_topk=" << normTopkProb << ",tie=" << tieWordEmbeddings
     << ",eps=" << rmsNormEps << ",theta=" << ropeTheta;
  // (Only when set: runs without router losses keep their fingerprint.)
  if (routerAuxLossCoef != 0)
    os << ",router_aux=" << routerAuxLossCoef;
  if (routerZLossCoef != 0)
    os << ",router_z=" << routerZLossCoef;
  if (routerBiasUpdateRate != 0)
    os << ",router_bias_rate=" << routerBiasUpdateRate;
  return s;
}

double ModelConfig::stepFlops(int64_t batch, int64_t seq) const {
  double h = double(hiddenSize), d = double(headDim);
  double active = 0;
  for (int64_t l = 0; l < numHiddenLayers; ++l) {
    active += h * d * double(numAttentionHeads + 2 * numKeyValueHeads) +
              double(numAttentionHeads) * d * h;
    if (isMoELayer(l))
      active += h * double(numExperts) +
                double(numExpertsPerTok) * 3 * h * double(moeIntermediateSize) +
                3 * h * double(sharedExpertIntermediateSize);
    else
      active += 3 * h * double(intermediateSize);
  }
  active += h * double(vocabSize);
  double attention = 12.0 * double(batch) * double(seq) * double(seq) *
                     double(numAttentionHeads) * d * double(numHiddenLayers);
  return 6.0 * active * double(batch * seq) + attention;
}

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

std::vector<ModelParameter> mlir::moe::modelParameters(const ModelConfig &c) {
  std::vector<ModelParameter> ps;
  auto add = [&](std::string name, std::vector<int64_t> shape,
                 bool transposed = true) {
    ModelParameter p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.hfTransposed = transposed && p.shape.size() >= 2;
    ps.push_back(std::move(p));
  };
  auto norm = [&](std::string name, int64_t size) {
    ModelParameter p;
    p.name = std::move(name);
    p.shape = {size};
    p.ones = true;
    ps.push_back(std::move(p));
  };
  int64_t h = c.hiddenSize, d = c.headDim, nq = c.numAttentionHeads,
          nkv = c.numKeyValueHeads;
  add("model.embed_tokens.weight", {c.vocabSize, h}, /*transposed=*/false);
  for (int64_t l = 0; l < c.numHiddenLayers; ++l) {
    std::string pre = "model.layers." + std::to_string(l) + ".";
    norm(pre + "input_layernorm.weight", h);
    add(pre + "self_attn.q_proj.weight", {h, nq * d});
    add(pre + "self_attn.k_proj.weight", {h, nkv * d});
    add(pre + "self_attn.v_proj.weight", {h, nkv * d});
    norm(pre + "self_attn.q_norm.weight", d);
    norm(pre + "self_attn.k_norm.weight", d);
    add(pre + "self_attn.o_proj.weight", {nq * d, h});
    norm(pre + "post_attention_layernorm.weight", h);
    if (c.isMoELayer(l)) {
      add(pre + "mlp.gate.weight", {h, c.numExperts});
      add(pre + "mlp.experts.gate_up_proj",
          {c.numExperts, h, 2 * c.moeIntermediateSize});
      add(pre + "mlp.experts.down_proj",
          {c.numExperts, c.moeIntermediateSize, h});
      if (int64_t s = c.sharedExpertIntermediateSize) {
        add(pre + "mlp.shared_expert.gate_proj.weight", {h, s});
        add(pre + "mlp.shared_expert.up_proj.weight", {h, s});
        add(pre + "mlp.shared_expert.down_proj.weight", {s, h});
      }
    } else {
      add(pre + "mlp.gate_proj.weight", {h, c.intermediateSize});
      add(pre + "mlp.up_proj.weight", {h, c.intermediateSize});
      add(pre + "mlp.down_proj.weight", {c.intermediateSize, h});
    }
  }
  norm("model.norm.weight", h);
  if (!c.tieWordEmbeddings)
    add("lm_head.weight", {h, c.vocabSize});
  return ps;
}

//===----------------------------------------------------------------------===//
// The graph
//===----------------------------------------------------------------------===//

namespace {
/// Builds the ops of the model at the end of one block.
struct GraphBuilder {
  OpBuilder &b;
  Location loc;
  Type f32;

  RankedTensorType t(ArrayRef<int64_t> shape, Type elt = {}) {
    return RankedTensorType::get(shape, elt ? elt : f32);
  }
  Value zeros(ArrayRef<int64_t> shape) {
    Value e = tensor::EmptyOp::create(b, loc, shape, f32);
    Value z = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0));
    return linalg::FillOp::create(b, loc, z, e).getResult(0);
  }
  Value ones(ArrayRef<int64_t> shape) {
    Value e = tensor::EmptyOp::create(b, loc, shape, f32);
    Value one = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(1));
    return linalg::FillOp::create(b, loc, one, e).getResult(0);
  }
  /// x [M, K] @ w [K, N].
  Value matmul(Value x, Value w) {
    auto xt = cast<RankedTensorType>(x.getType());
    auto wt = cast<RankedTensorType>(w.getType());
    return linalg::MatmulOp::create(
               b, loc, ValueRange{x, w},
               ValueRange{zeros({xt.getDimSize(0), wt.getDimSize(1)})})
        .getResult(0);
  }
  Value add(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value reshape(Value x, ArrayRef<int64_t> shape,
                ArrayRef<ReassociationIndices> groups, bool expand) {
    if (expand)
      return tensor::ExpandShapeOp::create(b, loc, t(shape), x, groups);
    return tensor::CollapseShapeOp::create(b, loc, t(shape), x, groups);
  }
  /// silu(g) * u = g / (1 + exp(-g)) * u, elementwise.
  Value siluMul(Value g, Value u) {
    auto shape = cast<RankedTensorType>(g.getType()).getShape();
    Value e = math::ExpOp::create(b, loc, arith::NegFOp::create(b, loc, g));
    Value den = add(ones(shape), e);
    return mul(arith::DivFOp::create(b, loc, g, den), u);
  }
};
} // namespace

OwningOpRef<ModuleOp>
mlir::moe::buildLanguageModel(MLIRContext *context, const ModelConfig &c,
                              int64_t batch, int64_t seq, bool documents,
                              bool layerFunctions, int64_t expertRowPadding) {
  context->loadDialect<MoEDialect, arith::ArithDialect, func::FuncDialect,
                       linalg::LinalgDialect, math::MathDialect,
                       tensor::TensorDialect>();
  OpBuilder b(context);
  Location top = NameLoc::get(b.getStringAttr("model"));
  OwningOpRef<ModuleOp> module = ModuleOp::create(top);
  Type f32 = b.getF32Type(), i32 = b.getI32Type();

  std::vector<ModelParameter> params = modelParameters(c);
  SmallVector<Type> argTypes;
  for (const ModelParameter &p : params)
    argTypes.push_back(RankedTensorType::get(p.shape, f32));
  argTypes.push_back(RankedTensorType::get({batch, seq}, i32));
  argTypes.push_back(RankedTensorType::get({batch, seq}, i32));
  int64_t moeLayers = 0;
  for (int64_t l = 0; l < c.numHiddenLayers; ++l)
    moeLayers += c.isMoELayer(l);
  bool routerBias = c.routerBiasUpdateRate > 0 && moeLayers > 0;
  if (routerBias)
    argTypes.push_back(RankedTensorType::get({moeLayers, c.numExperts}, f32));
  if (documents)
    argTypes.push_back(RankedTensorType::get({batch, seq}, i32));
  b.setInsertionPointToEnd(module->getBody());
  auto func = func::FuncOp::create(
      b, top, "loss",
      b.getFunctionType(argTypes, RankedTensorType::get({}, f32)));
  for (auto [i, p] : llvm::enumerate(params)) {
    func.setArgAttr(i, "moe.param", b.getStringAttr(p.name));
    func.setArgAttr(i, "moe.init", b.getStringAttr(p.ones ? "ones" : "normal"));
    if (p.hfTransposed)
      func.setArgAttr(i, "moe.hf_transposed", b.getUnitAttr());
  }
  auto str = [&](const llvm::Twine &t) { return b.getStringAttr(t.str()); };
  func->setAttr(
      "moe.meta",
      b.getDictionaryAttr({
          b.getNamedAttr("config", str(c.fingerprint())),
          b.getNamedAttr("vocab_size", str(llvm::Twine(c.vocabSize))),
          b.getNamedAttr("init_std",
                         str(llvm::formatv("{0}", c.initializerRange))),
          b.getNamedAttr("step_flops",
                         str(llvm::formatv("{0:e}", c.stepFlops(batch, seq)))),
          b.getNamedAttr("router_bias_update_rate",
                         str(llvm::formatv("{0:e}", c.routerBiasUpdateRate))),
      }));
  func.setArgAttr(params.size(), "moe.input", b.getStringAttr("ids"));
  func.setArgAttr(params.size() + 1, "moe.input", b.getStringAttr("labels"));
  if (routerBias) {
    func.setArgAttr(params.size() + 2, "moe.input",
                    b.getStringAttr("router_bias"));
    func.setArgAttr(params.size() + 2, "moe.no_grad", b.getUnitAttr());
  }
  if (documents)
    func.setArgAttr(argTypes.size() - 1, "moe.input",
                    b.getStringAttr("documents"));
  Block *body = func.addEntryBlock();
  b.setInsertionPointToEnd(body);

  unsigned next = 0;
  auto arg = [&](llvm::StringRef expected) {
    assert(params[next].name == expected && "parameters out of order");
    (void)expected;
    return body->getArgument(next++);
  };
  auto at = [&](const std::string &name) {
    return NameLoc::get(b.getStringAttr(name));
  };

  int64_t tokens = batch * seq, h = c.hiddenSize, d = c.headDim,
          nq = c.numAttentionHeads, nkv = c.numKeyValueHeads;
  double eps = c.rmsNormEps;
  Value ids = body->getArgument(params.size());
  Value labels = body->getArgument(params.size() + 1);
  Value docs = documents ? body->getArgument(argTypes.size() - 1) : Value();

  GraphBuilder g{b, at("model.embed_tokens"), f32};
  Value embed = arg("model.embed_tokens.weight");
  Value x = EmbeddingOp::create(b, g.loc, g.t({batch, seq, h}), embed, ids);
  x = g.reshape(x, {tokens, h}, {{0, 1}, {2}}, /*expand=*/false);

  auto rmsNorm = [&](Value v, Value w) {
    return RMSNormOp::create(b, g.loc, v.getType(), v, w,
                             b.getF64FloatAttr(eps))
        .getResult();
  };
  // One decoder layer at the end of the builder's block: the new residual
  // stream and, for an MoE layer, its router logits and expert counts.
  // `weight` gives the layer's parameter of a name (below the layer's
  // prefix), asked for in @loss's argument order; `prefix` names the ops'
  // locations.
  struct LayerOut {
    Value x, logits, counts;
  };
  auto buildLayer = [&](Value x, function_ref<Value(StringRef)> weight,
                        Value bias, Value docs, bool moeLayer,
                        const std::string &prefix) -> LayerOut {
    LayerOut out;
    // Attention block.
    g.loc = at(prefix + "self_attn");
    Value a = rmsNorm(x, weight("input_layernorm.weight"));
    Value wq = weight("self_attn.q_proj.weight");
    Value wk = weight("self_attn.k_proj.weight");
    Value wv = weight("self_attn.v_proj.weight");
    Value qNorm = weight("self_attn.q_norm.weight");
    Value kNorm = weight("self_attn.k_norm.weight");
    auto heads = [&](Value w, int64_t n) {
      return g.reshape(g.matmul(a, w), {batch, seq, n, d}, {{0, 1}, {2, 3}},
                       /*expand=*/true);
    };
    auto rotary = [&](Value v) {
      return RotaryOp::create(b, g.loc, v.getType(), v,
                              b.getF64FloatAttr(c.ropeTheta), UnitAttr())
          .getResult();
    };
    Value q = rotary(rmsNorm(heads(wq, nq), qNorm));
    Value k = rotary(rmsNorm(heads(wk, nkv), kNorm));
    Value v = heads(wv, nkv);
    Value o = AttentionOp::create(b, g.loc, q.getType(), q, k, v, docs,
                                  b.getUnitAttr(), FloatAttr());
    o = g.reshape(o, {tokens, nq * d}, {{0, 1}, {2, 3}}, /*expand=*/false);
    x = g.add(x, g.matmul(o, weight("self_attn.o_proj.weight")));

    // MLP block.
    g.loc = at(prefix + "mlp");
    a = rmsNorm(x, weight("post_attention_layernorm.weight"));
    Value y;
    if (moeLayer) {
      // The dispatch's worst case: every group padded.
      int64_t e = c.numExperts, k = c.numExpertsPerTok, pad = expertRowPadding;
      int64_t rows = DispatchOp::droplessRows(tokens * k, e, pad)
                         .value_or(ShapedType::kDynamic);
      Value logits = g.matmul(a, weight("mlp.gate.weight"));
      auto router = RouterOp::create(
          b, g.loc, g.t({tokens, k}, i32), g.t({tokens, k}), logits, bias,
          b.getI64IntegerAttr(k),
          ScoreFunctionAttr::get(context, ScoreFunction::softmax), UnitAttr(),
          c.normTopkProb ? b.getUnitAttr() : UnitAttr());
      auto dispatch = DispatchOp::create(
          b, g.loc, g.t({rows, h}), g.t({e + 1}, i32), g.t({e}, i32),
          g.t({tokens, k}, i32), a, router.getIndices(), b.getI64IntegerAttr(e),
          FloatAttr(), b.getI64IntegerAttr(pad));
      Value w1 = weight("mlp.experts.gate_up_proj");
      Value w2 = weight("mlp.experts.down_proj");
      Value ye = GroupedMlpOp::create(
          b, g.loc, g.t({rows, h}), dispatch.getSorted(), w1, w2,
          dispatch.getOffsets(), SwigluLayout::split, ScaleMode::rceil);
      y = CombineOp::create(b, g.loc, g.t({tokens, h}), ye, router.getWeights(),
                            dispatch.getPositions());
      out.logits = logits;
      out.counts = dispatch.getCounts();
      if (c.sharedExpertIntermediateSize) {
        Value sg = g.matmul(a, weight("mlp.shared_expert.gate_proj.weight"));
        Value su = g.matmul(a, weight("mlp.shared_expert.up_proj.weight"));
        y = g.add(y, g.matmul(g.siluMul(sg, su),
                              weight("mlp.shared_expert.down_proj.weight")));
      }
    } else {
      Value gate = g.matmul(a, weight("mlp.gate_proj.weight"));
      Value up = g.matmul(a, weight("mlp.up_proj.weight"));
      y = g.matmul(g.siluMul(gate, up), weight("mlp.down_proj.weight"));
    }
    out.x = g.add(x, y);
    return out;
  };

  // With layer functions, each kind of layer (MoE, dense) is a private
  // function called once per layer of that kind, so that later passes (and
  // the backward, which -moe-autodiff builds once per function) see one
  // layer instead of all of them.
  struct LayerFunction {
    func::FuncOp func;
    SmallVector<std::string> weights; // names below the layer prefix
  };
  LayerFunction layerFunctionOf[2];
  auto layerFunction = [&](int64_t l, bool moeLayer) -> LayerFunction & {
    LayerFunction &lf = layerFunctionOf[moeLayer];
    if (lf.func)
      return lf;
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(func);
    Location fl = at(moeLayer ? "decoder_layer_moe" : "decoder_layer_dense");
    lf.func = func::FuncOp::create(
        b, fl, moeLayer ? "decoder_layer_moe" : "decoder_layer_dense",
        b.getFunctionType({}, {}));
    lf.func.setPrivate();
    // Arguments: x, the layer's parameters (in @loss's order, which is
    // the order the layer reads them), the router bias, the documents.
    Block *fb = lf.func.addEntryBlock();
    b.setInsertionPointToEnd(fb);
    Value fx = fb->addArgument(g.t({tokens, h}), fl);
    std::string pre = "model.layers." + std::to_string(l) + ".";
    llvm::StringMap<Value> weights;
    for (const ModelParameter &p : params)
      if (StringRef(p.name).consume_front(pre)) {
        lf.weights.push_back(p.name.substr(pre.size()));
        weights[lf.weights.back()] =
            fb->addArgument(RankedTensorType::get(p.shape, f32), fl);
      }
    auto weight = [&](StringRef name) -> Value {
      assert(weights.count(name) && "unknown layer parameter");
      return weights.lookup(name);
    };
    Value fbias, fdocs;
    if (moeLayer && routerBias)
      fbias = fb->addArgument(g.t({c.numExperts}), fl);
    if (docs)
      fdocs = fb->addArgument(docs.getType(), fl);
    LayerOut out = buildLayer(fx, weight, fbias, fdocs, moeLayer, "");
    SmallVector<Value> results = {out.x};
    if (moeLayer)
      results.append({out.logits, out.counts});
    func::ReturnOp::create(b, fl, results);
    lf.func.setFunctionType(b.getFunctionType(fb->getArgumentTypes(),
                                              ValueRange(results).getTypes()));
    if (fbias)
      lf.func.setArgAttr(cast<BlockArgument>(fbias).getArgNumber(),
                         "moe.no_grad", b.getUnitAttr());
    return lf;
  };

  SmallVector<Value> routerLogits, routerCounts; // per MoE layer
  for (int64_t l = 0; l < c.numHiddenLayers; ++l) {
    std::string pre = "model.layers." + std::to_string(l) + ".";
    bool moeLayer = c.isMoELayer(l);
    Value bias; // this layer's row of the selection bias
    if (moeLayer && routerBias) {
      g.loc = at(pre + "mlp");
      int64_t e = c.numExperts;
      Value all = func.getArgument(params.size() + 2);
      Value row = tensor::ExtractSliceOp::create(
          b, g.loc, g.t({1, e}), all,
          ArrayRef<OpFoldResult>{b.getIndexAttr(int64_t(routerLogits.size())),
                                 b.getIndexAttr(0)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(e)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
      bias = g.reshape(row, {e}, {{0, 1}}, /*expand=*/false);
    }
    LayerOut out;
    if (!layerFunctions) {
      out = buildLayer(
          x, [&](StringRef name) { return arg(pre + name.str()); }, bias, docs,
          moeLayer, pre);
    } else {
      LayerFunction &lf = layerFunction(l, moeLayer);
      SmallVector<Value> operands = {x};
      for (const std::string &name : lf.weights)
        operands.push_back(arg(pre + name));
      if (bias)
        operands.push_back(bias);
      if (docs)
        operands.push_back(docs);
      g.loc = at(pre.substr(0, pre.size() - 1));
      auto call = func::CallOp::create(b, g.loc, lf.func, operands);
      call.setNoInline(true);
      out.x = call.getResult(0);
      if (moeLayer) {
        out.logits = call.getResult(1);
        out.counts = call.getResult(2);
      }
    }
    x = out.x;
    if (moeLayer) {
      routerLogits.push_back(out.logits);
      routerCounts.push_back(out.counts);
    }
  }
  g.loc = at("model.norm");
  x = rmsNorm(x, arg("model.norm.weight"));
  g.loc = at("lm_head");
  Value head;
  if (c.tieWordEmbeddings) {
    Value init = tensor::EmptyOp::create(b, g.loc, {h, c.vocabSize}, f32);
    head = linalg::TransposeOp::create(b, g.loc, embed, init,
                                       ArrayRef<int64_t>{1, 0})
               .getResult()[0];
  } else {
    head = arg("lm_head.weight");
  }
  Value logits = g.matmul(x, head);
  g.loc = at("loss");
  Value flatLabels = tensor::CollapseShapeOp::create(
      b, g.loc, g.t({tokens}, i32), labels,
      SmallVector<ReassociationIndices>{{0, 1}});
  Value loss = CrossEntropyOp::create(b, g.loc, g.t({}), logits, flatLabels);
  if (!routerLogits.empty() &&
      (c.routerAuxLossCoef != 0 || c.routerZLossCoef != 0)) {
    g.loc = at("router_loss");
    Value router =
        RouterLossOp::create(b, g.loc, g.t({}), routerLogits, routerCounts,
                             b.getF64FloatAttr(c.routerAuxLossCoef),
                             b.getF64FloatAttr(c.routerZLossCoef));
    // The sum as [1] tensors (an elementwise op on 0-d tensors would run
    // on the host).
    Value sum = g.add(g.reshape(loss, {1}, {}, /*expand=*/true),
                      g.reshape(router, {1}, {}, /*expand=*/true));
    loss = g.reshape(sum, {}, {}, /*expand=*/false);
  }
  // Output: how many top-k assignments each expert got in each MoE layer
  // (the dispatches' counts), for the trainer's metrics.
  SmallVector<Value> results = {loss};
  if (!routerCounts.empty()) {
    g.loc = at("expert_load");
    int64_t layers = routerCounts.size(), e = c.numExperts;
    Value load = tensor::EmptyOp::create(b, g.loc, {layers, e}, i32);
    for (auto [l, counts] : llvm::enumerate(routerCounts)) {
      Value row = tensor::ExpandShapeOp::create(
          b, g.loc, g.t({1, e}, i32), counts,
          SmallVector<ReassociationIndices>{{0, 1}});
      load = tensor::InsertSliceOp::create(
          b, g.loc, row, load,
          ArrayRef<OpFoldResult>{b.getIndexAttr(int64_t(l)), b.getIndexAttr(0)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(e)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
    }
    results.push_back(load);
    func.setFunctionType(b.getFunctionType(
        argTypes, {loss.getType(), RankedTensorType::get({layers, e}, i32)}));
    func.setResultAttr(1, "moe.output", b.getStringAttr("expert_load"));
  }
  func::ReturnOp::create(b, g.loc, results);
  assert(next == params.size() && "unused parameters");
  return module;
}
