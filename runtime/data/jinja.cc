// Values of runtime/data/jinja.h: construction, JSON in, and printing as
// Python prints them (str, repr, json.dumps).
#include "runtime/data/jinja.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace loom::jinja {

// ---------------------------------------------------------------- values

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<std::string>(std::move(s));
  return v;
}
Value Value::ListOf(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::TupleOf(List items) {
  Value v = ListOf(std::move(items));
  v.tuple_ = true;
  return v;
}
Value Value::DictOf(Dict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(items));
  return v;
}
Value Value::Namespace(Dict items) {
  Value v = DictOf(std::move(items));
  v.ns_ = true;
  return v;
}
Value Value::MacroOf(std::shared_ptr<const Macro> m) {
  Value v;
  v.kind_ = Kind::kMacro;
  v.macro_ = std::move(m);
  return v;
}

namespace {

Value FromJsonValue(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::Int(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value::List l;
      for (const auto& e : j) l.push_back(FromJsonValue(e));
      return Value::ListOf(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value::Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), FromJsonValue(*it));
      return Value::DictOf(std::move(d));
    }
    default:
      return Value();
  }
}

}  // namespace

absl::StatusOr<Value> Value::FromJson(std::string_view json) {
  nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  return FromJsonValue(j);
}

const Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::Set(const std::string& key, Value v) {
  for (auto& [k, old] : *dict_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  dict_->emplace_back(key, std::move(v));
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return ns_ || !dict_->empty();
    case Kind::kMacro:
      return true;
  }
  return false;
}

namespace {

// Python's repr of a float: the shortest digits that read back the same,
// positional for exponents in [-4, 16), else scientific.
std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[40];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof(buf), "%.*e", p - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf: [-]D.DDDDe[+-]XX
  std::string s(buf);
  const size_t e = s.find('e');
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string mant = s.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
            digits.substr(static_cast<size_t>(exp + 1));
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += absl::StrFormat("e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  }
  return neg ? "-" + out : out;
}

std::string PyQuote(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\x%02x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(i_);
    case Kind::kFloat:
      return FloatRepr(f_);
    case Kind::kString:
      return *s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kString:
      return PyQuote(*s_);
    case Kind::kList: {
      std::vector<std::string> parts;
      for (const Value& v : *list_) parts.push_back(v.Repr());
      if (tuple_) return "(" + absl::StrJoin(parts, ", ") + (parts.size() == 1 ? ",)" : ")");
      return "[" + absl::StrJoin(parts, ", ") + "]";
    }
    case Kind::kDict: {
      std::vector<std::string> parts;
      for (const auto& [k, v] : *dict_) parts.push_back(PyQuote(k) + ": " + v.Repr());
      return (ns_ ? "<Namespace {" : "{") + absl::StrJoin(parts, ", ") + (ns_ ? "}>" : "}");
    }
    case Kind::kMacro:
      return "<Macro>";
    default:
      return Str();
  }
}

namespace {

void JsonString(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          *out += absl::StrFormat("\\u%04x", c);
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

void JsonInto(const Value& v, int indent, int level, std::string* out) {
  const std::string item_sep = indent < 0 ? ", " : ",";
  auto newline = [&](int l) {
    if (indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(indent * l), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      *out += "null";
      return;
    case Value::Kind::kBool:
      *out += v.b() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      *out += absl::StrCat(v.i());
      return;
    case Value::Kind::kFloat:
      *out += std::isnan(v.f())   ? "NaN"
              : std::isinf(v.f()) ? (v.f() > 0 ? "Infinity" : "-Infinity")
                                  : FloatRepr(v.f());
      return;
    case Value::Kind::kString:
      JsonString(v.s(), out);
      return;
    case Value::Kind::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t k = 0; k < v.list().size(); ++k) {
        if (k > 0) *out += item_sep;
        newline(level + 1);
        JsonInto(v.list()[k], indent, level + 1, out);
      }
      newline(level);
      *out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict().empty()) {
        *out += "{}";
        return;
      }
      *out += '{';
      for (size_t k = 0; k < v.dict().size(); ++k) {
        if (k > 0) *out += item_sep;
        newline(level + 1);
        JsonString(v.dict()[k].first, out);
        *out += ": ";
        JsonInto(v.dict()[k].second, indent, level + 1, out);
      }
      newline(level);
      *out += '}';
      return;
    }
    case Value::Kind::kMacro:
      *out += "null";
      return;
  }
}

}  // namespace

std::string Value::Json(int indent) const {
  std::string out;
  JsonInto(*this, indent, 0, &out);
  return out;
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt) return a.i() == b.i();
    return a.f() == b.f();
  }
  if (a.kind() == Value::Kind::kBool && b.is_number()) return Equal(Value::Int(a.b()), b);
  if (b.kind() == Value::Kind::kBool && a.is_number()) return Equal(a, Value::Int(b.b()));
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kBool:
      return a.b() == b.b();
    case Value::Kind::kString:
      return a.s() == b.s();
    case Value::Kind::kList:
      if (a.list().size() != b.list().size()) return false;
      for (size_t k = 0; k < a.list().size(); ++k) {
        if (!Equal(a.list()[k], b.list()[k])) return false;
      }
      return true;
    case Value::Kind::kDict:
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict()) {
        const Value* o = b.Find(k);
        if (o == nullptr || !Equal(v, *o)) return false;
      }
      return true;
    default:
      return a.macro() == b.macro();
  }
}

}  // namespace loom::jinja
