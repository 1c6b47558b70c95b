//===- LanguageModel.h - MoE language models from a config ------*- C++ -*-===//
//
// The model graph of an MoE causal language model of the Qwen3-MoE family,
// built from a Hugging Face style config.json: token embedding, decoder
// layers (RMSNorm, grouped-query attention with per-head q/k RMSNorm and
// rotary embeddings, an MoE or dense SwiGLU MLP, optional always-on shared
// expert), final RMSNorm, LM head and the next-token cross-entropy loss.
//
// The graph is one function
//
//   func.func @loss(<parameters...>, %ids: tensor<BxSxi32>,
//                   %labels: tensor<BxSxi32>) -> tensor<f32>
//
// (-moe-autodiff turns it into @loss_grad). Every parameter argument
// carries `moe.param = "<Hugging Face name>"`, `moe.init = "normal" | "ones"`
// and, where our layout [in, out] is the transpose of Hugging Face's
// [out, in] in the last two dimensions, `moe.hf_transposed`; the data
// arguments carry `moe.input = "ids" | "labels"`. The function's `moe.meta`
// holds what a trainer needs besides the graph (config fingerprint, vocab
// size, init std, FLOPs per step), as strings; moe-compile puts them in the
// artifact's manifest.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_MODELS_LANGUAGEMODEL_H
#define MOE_MODELS_LANGUAGEMODEL_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace mlir::moe {

struct ModelConfig {
  int64_t hiddenSize = 0;
  int64_t moeIntermediateSize = 0;
  int64_t numExperts = 0;
  int64_t numExpertsPerTok = 0;
  int64_t numHiddenLayers = 0;
  int64_t numAttentionHeads = 0;
  int64_t numKeyValueHeads = 0;
  int64_t headDim = 0;
  int64_t vocabSize = 0;
  /// Dense SwiGLU MLP size of the layers that are not MoE layers.
  int64_t intermediateSize = 0;
  /// Layer i is an MoE layer iff it is not in mlpOnlyLayers and
  /// (i + 1) % decoderSparseStep == 0.
  int64_t decoderSparseStep = 1;
  std::vector<int64_t> mlpOnlyLayers;
  /// An always-on (ungated) shared expert of this size in every MoE layer;
  /// 0 for none.
  int64_t sharedExpertIntermediateSize = 0;
  bool normTopkProb = true;
  bool tieWordEmbeddings = false;
  double rmsNormEps = 1e-6;
  double ropeTheta = 1e6;
  double initializerRange = 0.02;
  /// The routers' auxiliary losses added to the loss (moe.router_loss):
  /// 'router_aux_loss_coef' when 'output_router_logits' is true (as in
  /// transformers), else 0; 'router_z_loss_coef' (default 0).
  double routerAuxLossCoef = 0;
  double routerZLossCoef = 0;
  /// Auxiliary-loss-free balancing (DeepSeek-V3): 'router_bias_update_rate'
  /// > 0 gives every MoE layer's router a selection bias (the loss
  /// function's `router_bias` input, [MoE layers, experts]) that the
  /// trainer moves by this rate after each step, up for experts below the
  /// mean load and down for those above.
  double routerBiasUpdateRate = 0;

  /// Parses a config.json text. Errors name the field and say what is
  /// wrong; `source` (a path) prefixes them.
  static llvm::Expected<ModelConfig> parse(llvm::StringRef json,
                                           llvm::StringRef source);
  static llvm::Expected<ModelConfig> load(llvm::StringRef path);

  bool isMoELayer(int64_t layer) const;

  /// Every field that shapes the model, on one line: two configs with the
  /// same fingerprint build the same graph.
  std::string fingerprint() const;

  /// Model FLOPs of one train step (forward + backward) on `batch` x `seq`
  /// tokens: 6 x active parameters x tokens (the embedding lookup excluded)
  /// plus attention's score and value products (12 x B x S^2 x heads x
  /// head_dim per layer).
  double stepFlops(int64_t batch, int64_t seq) const;
};

/// One parameter of the model, in argument order.
struct ModelParameter {
  std::string name;           ///< the Hugging Face name
  std::vector<int64_t> shape; ///< our layout
  bool ones = false;          ///< initialized to ones (norm weights)
  bool hfTransposed = false;  ///< last two dims swapped vs Hugging Face
};

/// The parameters of `config`'s model, in the order of @loss's arguments.
std::vector<ModelParameter> modelParameters(const ModelConfig &config);

/// Builds the loss function for `batch` sequences of `seq` tokens. With
/// `documents`, @loss takes a last argument of role `documents`, i32
/// [batch, seq]: the document of each token of the packed rows, and
/// attention stays within documents. With `layerFunctions`, each kind of
/// decoder layer (MoE, dense) is one private function, @decoder_layer_moe
/// or @decoder_layer_dense, called once per layer (`no_inline`): the
/// compiler then works on one layer of each kind, whatever the depth.
/// `expertRowPadding`: every expert's group of dispatched rows is padded to
/// a multiple of it (moe.dispatch pad_to; see expertRowPadding()).
OwningOpRef<ModuleOp>
buildLanguageModel(MLIRContext *context, const ModelConfig &config,
                   int64_t batch, int64_t seq, bool documents = false,
                   bool layerFunctions = false, int64_t expertRowPadding = 1);

} // namespace mlir::moe

#endif
