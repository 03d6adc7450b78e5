// Hugging Face causal language models as Loom LLMs: the config.json and the
// weights of LlamaForCausalLM (Llama 2, 3, 3.1+) and Qwen2ForCausalLM, on
// their own or as the language model inside a LLaVA directory.
//
// config.json -> LlmConfig: vocab_size, hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, intermediate_size,
// rms_norm_eps, max_position_embeddings and the RoPE settings are required
// (no silent defaults); head_dim defaults to hidden_size /
// num_attention_heads and tie_word_embeddings / attention_bias to the
// family's defaults in transformers (false), as transformers itself does.
// RoPE settings in either spelling: `rope_theta` + `rope_scaling` (null, or
// rope_type "default" or "llama3"), or the newer `rope_parameters`
// {rope_type, rope_theta, ...}; both present must agree. Anything Loom would
// compute differently (another activation, sliding windows, o_proj or MLP
// biases, another RoPE type, Qwen3's q/k norms) is INVALID_ARGUMENT naming
// the field.
//
// Weights: q_proj, k_proj and v_proj (and Qwen2's biases) stack into Loom's
// fused q|k|v rows; every other tensor maps one to one (llm.h). Loaded
// directly into any TP slice of any pipeline stage, one tensor in memory at
// a time.
#ifndef LOOM_RUNTIME_HF_HF_LLM_H_
#define LOOM_RUNTIME_HF_HF_LLM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/hf/hf_params.h"
#include "runtime/hf/safetensors.h"
#include "runtime/model/config.h"
#include "runtime/model/llm.h"
#include "runtime/model/params.h"

namespace loom::hf {

// Where a checkpoint keeps the LLM's tensors: `body` + "embed_tokens.weight",
// "layers.N....", "norm.weight"; `head` + "weight" (the output projection).
struct LlmKeys {
  std::string body;
  std::string head;
};
inline LlmKeys CausalLmKeys() { return {"model.", "lm_head."}; }
// LlavaForConditionalGeneration as saved by transformers before 4.52 (and
// as Loom exports it).
inline LlmKeys LlavaLlmKeys() { return {"language_model.model.", "language_model.lm_head."}; }

// The LLM of a config.json object (a whole file's text, or a LLaVA
// config's text_config re-serialised); `where` names it in errors.
absl::StatusOr<LlmConfig> ParseLlmConfig(const std::string& json_text, const std::string& where);
// DIR/config.json of a LlamaForCausalLM or Qwen2ForCausalLM directory.
absl::StatusOr<LlmConfig> ReadLlmConfig(const std::string& dir);

// The Hugging Face tensors a Loom LLM parameter is made of, in order (q, k, v
// for the fused projection; one name otherwise).
absl::StatusOr<HfParts> LlmHfParts(const LlmConfig& c, const std::string& loom_name,
                                   const LlmKeys& keys);

// Fills `params` (an Llm's: any TP slice, any pipeline stage) from `model`;
// a tensor missing or of another shape than the config gives is an error
// naming it. The optimizer state is left as it is.
absl::Status LoadLlmWeights(const SafetensorsModel& model, const LlmConfig& c, const LlmKeys& keys,
                            ParamSet* params);
// INVALID_ARGUMENT naming the first tensor under `keys` that the config
// does not explain (a family feature Loom does not run, or a config that is
// not the checkpoint's). RoPE buffers (rotary_emb.inv_freq) are ignored; a
// tied model's stored lm_head must equal its embedding table.
absl::Status CheckLlmTensorsKnown(const SafetensorsModel& model, const LlmConfig& c,
                                  const LlmKeys& keys);

// The whole LLM (`master`: TP 1, every layer) as Hugging Face tensors, in
// transformers' order: embed_tokens, each layer's input_layernorm, q, k, v
// (weights, then biases), o, post_attention_layernorm, gate, up, down, then
// norm and lm_head (not written when tied). `grads`: the gradients instead.
std::vector<NamedTensor> LlmToHf(const LlmConfig& c, ParamSet& master, const LlmKeys& keys,
                                 bool grads);

// A whole LlamaForCausalLM / Qwen2ForCausalLM directory as one Loom Llm
// (one rank, one stage): config, every tensor checked and loaded.
absl::StatusOr<std::unique_ptr<Llm>> OpenHfLlm(const std::string& dir);

// "1,2,3/4,5": token sequences packed into one batch ('/' between
// sequences), every id in [0, vocab), each sequence at least 1 token;
// INVALID_ARGUMENT naming the bad item.
absl::StatusOr<LlmBatch> ParseTokenBatch(const std::string& text, int vocab);
// The sequences of such a list, unpacked.
absl::StatusOr<std::vector<std::vector<int32_t>>> ParseTokenSequences(const std::string& text,
                                                                      int vocab);

}  // namespace loom::hf

#endif  // LOOM_RUNTIME_HF_HF_LLM_H_
