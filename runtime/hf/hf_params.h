// What the Hugging Face families share (hf_llm, hf_vision): checked access to
// config.json fields, and moving a Loom ParamSet to and from Hugging Face
// tensors through a map from each Loom parameter to the tensors it is made
// of (several for a fused q|k|v projection, one otherwise).
#ifndef LOOM_RUNTIME_HF_HF_PARAMS_H_
#define LOOM_RUNTIME_HF_HF_PARAMS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/activation/activation.h"
#include "nlohmann/json.hpp"
#include "runtime/hf/safetensors.h"
#include "runtime/model/params.h"

namespace loom::hf {

// The Hugging Face tensors a Loom parameter is made of, in order, and each
// one's shape: together they are the parameter's master (TP 1) in row-major
// order (a patch embedding's [D, 3, P, P] is Loom's (D, 3·P·P)).
struct HfParts {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
};
using PartsFn = std::function<absl::StatusOr<HfParts>(const std::string& loom_name)>;

// Fills `params` (any TP slice, any pipeline stage) from `model`, one
// parameter's master in memory at a time; a tensor missing or of another
// shape than the config gives is an error naming it. The optimizer state is
// left as it is.
absl::Status LoadParams(const SafetensorsModel& model, const PartsFn& parts, ParamSet* params);

// One Hugging Face tensor, fp32.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// The parameters `loom_names` of `master` (TP 1) as Hugging Face tensors, in
// that order; names the set lacks are skipped. `grads`: the gradients.
std::vector<NamedTensor> ParamsToHf(const std::vector<std::string>& loom_names,
                                    const PartsFn& parts, ParamSet& master, bool grads);

// A config.json activation name (hidden_act): quick_gelu, gelu (erf),
// gelu_pytorch_tanh or gelu_new (tanh); INVALID_ARGUMENT "<where>: <field>:
// ..." for others. ActivationName is its inverse (tanh: gelu_pytorch_tanh).
absl::StatusOr<kernels::Activation> ParseActivation(const std::string& where,
                                                    const std::string& field,
                                                    const std::string& name);
const char* ActivationName(kernels::Activation act);

// "[1, 2, 3]".
std::string ShapeString(const std::vector<int64_t>& shape);

// INVALID_ARGUMENT "<where>: <field>: <why>".
absl::Status BadField(const std::string& where, const std::string& field, const std::string& why);

// Typed, checked access to one config.json object; errors name `where` and
// the field.
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}

  bool Has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  absl::StatusOr<int> Int(const std::string& key, int min = 1) const;
  absl::StatusOr<double> Number(const std::string& key) const;  // finite, > 0
  absl::StatusOr<bool> Bool(const std::string& key, bool absent) const;
  absl::StatusOr<std::string> String(const std::string& key) const;

  const nlohmann::json& at(const std::string& key) const { return j_.at(key); }
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& j_;
  std::string where_;
};

// `lhs = *expr`, or return expr's status.
#define LOOM_HF_ASSIGN(lhs, expr)             \
  do {                                        \
    auto loom_v = (expr);                     \
    if (!loom_v.ok()) return loom_v.status(); \
    lhs = *loom_v;                            \
  } while (0)

}  // namespace loom::hf

#endif  // LOOM_RUNTIME_HF_HF_PARAMS_H_
