#include "runtime/hf/hf_params.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"

namespace loom::hf {

using nlohmann::json;

absl::Status BadField(const std::string& where, const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, ": ", why));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

absl::StatusOr<int> Fields::Int(const std::string& key, int min) const {
  if (!Has(key)) return BadField(where_, key, "missing (required)");
  const json& v = j_.at(key);
  if (!v.is_number_integer()) return BadField(where_, key, "must be an integer, not " + v.dump());
  const int64_t x = v.get<int64_t>();
  if (x < min || x > (int64_t{1} << 30)) {
    return BadField(where_, key, absl::StrCat(x, " is out of range (>= ", min, ")"));
  }
  return static_cast<int>(x);
}

absl::StatusOr<double> Fields::Number(const std::string& key) const {
  if (!Has(key)) return BadField(where_, key, "missing (required)");
  const json& v = j_.at(key);
  if (!v.is_number()) return BadField(where_, key, "must be a number, not " + v.dump());
  const double x = v.get<double>();
  if (!std::isfinite(x) || x <= 0) return BadField(where_, key, absl::StrCat(x, " must be > 0"));
  return x;
}

absl::StatusOr<bool> Fields::Bool(const std::string& key, bool absent) const {
  if (!Has(key)) return absent;
  const json& v = j_.at(key);
  if (!v.is_boolean()) return BadField(where_, key, "must be true or false, not " + v.dump());
  return v.get<bool>();
}

absl::StatusOr<std::string> Fields::String(const std::string& key) const {
  if (!Has(key)) return BadField(where_, key, "missing (required)");
  const json& v = j_.at(key);
  if (!v.is_string()) return BadField(where_, key, "must be a string, not " + v.dump());
  return v.get<std::string>();
}

absl::StatusOr<kernels::Activation> ParseActivation(const std::string& where,
                                                    const std::string& field,
                                                    const std::string& name) {
  if (name == "quick_gelu") return kernels::Activation::kQuickGelu;
  if (name == "gelu") return kernels::Activation::kGeluErf;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return kernels::Activation::kGeluTanh;
  return BadField(where, field,
                  "'" + name + "' is not run by Loom (gelu, gelu_pytorch_tanh, quick_gelu are)");
}

const char* ActivationName(kernels::Activation act) {
  switch (act) {
    case kernels::Activation::kQuickGelu:
      return "quick_gelu";
    case kernels::Activation::kGeluErf:
      return "gelu";
    case kernels::Activation::kGeluTanh:
      break;
  }
  return "gelu_pytorch_tanh";
}

absl::Status LoadParams(const SafetensorsModel& model, const PartsFn& parts_of, ParamSet* params) {
  const TpShard shard = params->shard();
  std::vector<float> master;
  for (int i = 0; i < static_cast<int>(params->specs().size()); ++i) {
    const ParamSpec& spec = params->spec(i);
    absl::StatusOr<HfParts> parts = parts_of(spec.name);
    if (!parts.ok()) return parts.status();
    master.clear();
    for (size_t k = 0; k < parts->names.size(); ++k) {
      const std::string& hf = parts->names[k];
      const TensorEntry* e = model.Find(hf);
      if (e == nullptr) {
        return absl::NotFoundError(
            absl::StrCat(model.where(), ": no tensor ", hf, " (for ", spec.name, ")"));
      }
      if (e->shape != parts->shapes[k]) {
        return absl::InvalidArgumentError(absl::StrCat(model.where(), ": ", hf, " is ",
                                                       ShapeString(e->shape), ", the config gives ",
                                                       ShapeString(parts->shapes[k])));
      }
      absl::StatusOr<std::vector<float>> data = model.ReadF32(hf);
      if (!data.ok()) return data.status();
      master.insert(master.end(), data->begin(), data->end());
    }
    if (static_cast<int64_t>(master.size()) != NumElements(spec.master_shape)) {
      return absl::InternalError("parameter " + spec.name + ": its Hugging Face parts hold " +
                                 std::to_string(master.size()) + " values, not " +
                                 std::to_string(NumElements(spec.master_shape)));
    }
    float* dst = params->param(i);
    for (const SliceRun& r : SliceRuns(spec, shard)) {
      std::memcpy(dst + r.offset, master.data() + r.master_offset, sizeof(float) * r.length);
    }
  }
  return absl::OkStatus();
}

std::vector<NamedTensor> ParamsToHf(const std::vector<std::string>& loom_names,
                                    const PartsFn& parts_of, ParamSet& master, bool grads) {
  std::vector<NamedTensor> out;
  for (const std::string& n : loom_names) {
    const int i = master.Find(n);
    if (i < 0) continue;  // the caller's set lacks it: checked by the caller
    const float* src = grads ? master.grad(i) : master.param(i);
    absl::StatusOr<HfParts> parts = parts_of(n);
    LOOM_CHECK(parts.ok()) << parts.status();
    int64_t at = 0;
    for (size_t k = 0; k < parts->names.size(); ++k) {
      NamedTensor t;
      t.name = parts->names[k];
      t.shape = parts->shapes[k];
      const int64_t numel = NumElements(t.shape);
      t.data.assign(src + at, src + at + numel);
      at += numel;
      out.push_back(std::move(t));
    }
    LOOM_CHECK(at == NumElements(master.spec(i).master_shape)) << n << ": parts do not fill it";
  }
  return out;
}

}  // namespace loom::hf
