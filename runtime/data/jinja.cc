#include "runtime/data/jinja.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>

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

// ---------------------------------------------------------------- lexer

namespace {

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;  // text, name, string value, number, operator
  int line = 1;
};

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string RStrip(std::string s) {
  while (!s.empty() && IsSpace(s.back())) s.pop_back();
  return s;
}

absl::Status SyntaxError(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("template line ", line, ": ", what));
}

// Appends the UTF-8 of code point `cp`.
void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Lexes the inside of a tag from `*pos` up to its closing delimiter
// ("}}" or "%}", with an optional '-' or '+' before it).
absl::Status LexTag(std::string_view src, size_t* pos, int* line, std::string_view close,
                    std::vector<Token>* out, char* strip_after) {
  size_t& p = *pos;
  int depth = 0;  // open brackets: "}}" inside "{'a': {}}" closes a dict, not the tag
  while (true) {
    while (p < src.size() && IsSpace(src[p])) {
      if (src[p] == '\n') ++*line;
      ++p;
    }
    if (p >= src.size())
      return SyntaxError(*line, absl::StrCat("missing '", std::string(close), "'"));
    // The closing delimiter, with its whitespace control.
    for (char ctl : {'-', '+', '\0'}) {
      if (depth > 0) break;
      const std::string end =
          ctl == '\0' ? std::string(close) : std::string(1, ctl) + std::string(close);
      if (src.substr(p, end.size()) == end) {
        p += end.size();
        *strip_after = ctl;
        return absl::OkStatus();
      }
    }
    const char c = src[p];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = p;
      while (e < src.size() && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_'))
        ++e;
      out->push_back({Tok::kName, std::string(src.substr(p, e - p)), *line});
      p = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = p;
      bool is_float = false;
      while (e < src.size() && (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_'))
        ++e;
      if (e + 1 < src.size() && src[e] == '.' &&
          std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
        is_float = true;
        ++e;
        while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
      }
      if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
        size_t f = e + 1;
        if (f < src.size() && (src[f] == '+' || src[f] == '-')) ++f;
        if (f < src.size() && std::isdigit(static_cast<unsigned char>(src[f]))) {
          is_float = true;
          e = f;
          while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
        }
      }
      std::string num;
      for (char d : src.substr(p, e - p)) {
        if (d != '_') num += d;
      }
      out->push_back({is_float ? Tok::kFloat : Tok::kInt, num, *line});
      p = e;
    } else if (c == '\'' || c == '"') {
      std::string s;
      size_t e = p + 1;
      while (true) {
        if (e >= src.size()) return SyntaxError(*line, "unterminated string");
        const char d = src[e];
        if (d == c) break;
        if (d == '\n') ++*line;
        if (d != '\\') {
          s += d;
          ++e;
          continue;
        }
        if (e + 1 >= src.size()) return SyntaxError(*line, "unterminated string");
        const char x = src[e + 1];
        e += 2;
        switch (x) {
          case 'n':
            s += '\n';
            break;
          case 't':
            s += '\t';
            break;
          case 'r':
            s += '\r';
            break;
          case '0':
            s += '\0';
            break;
          case 'a':
            s += '\a';
            break;
          case 'b':
            s += '\b';
            break;
          case 'f':
            s += '\f';
            break;
          case 'v':
            s += '\v';
            break;
          case '\\':
            s += '\\';
            break;
          case '\'':
            s += '\'';
            break;
          case '"':
            s += '"';
            break;
          case '\n':
            ++*line;
            break;
          case 'x':
          case 'u':
          case 'U': {
            const size_t n = x == 'x' ? 2 : x == 'u' ? 4 : 8;
            if (e + n > src.size()) return SyntaxError(*line, "truncated escape in string");
            uint32_t cp = 0;
            for (size_t k = 0; k < n; ++k) {
              const char h = src[e + k];
              if (!std::isxdigit(static_cast<unsigned char>(h))) {
                return SyntaxError(*line, "bad escape in string");
              }
              cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                       ? h - '0'
                                                       : std::tolower(h) - 'a' + 10);
            }
            if (cp > 0x10FFFF) return SyntaxError(*line, "bad escape in string");
            AppendUtf8(cp, &s);
            e += n;
            break;
          }
          default:
            s += '\\';
            s += x;
        }
      }
      out->push_back({Tok::kString, s, *line});
      p = e + 1;
    } else {
      static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                   "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                   "{",  "}",  ",",  ":",  ".",  "|",  "="};
      bool found = false;
      for (const char* op : kOps) {
        const size_t n = std::strlen(op);
        if (src.substr(p, n) == op) {
          if (n == 1 && (*op == '(' || *op == '[' || *op == '{')) ++depth;
          if (n == 1 && (*op == ')' || *op == ']' || *op == '}')) depth = std::max(0, depth - 1);
          out->push_back({Tok::kOp, op, *line});
          p += n;
          found = true;
          break;
        }
      }
      if (!found)
        return SyntaxError(*line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
  }
}

// The template as tokens, with trim_blocks and lstrip_blocks applied as
// jinja2's lexer applies them.
absl::StatusOr<std::vector<Token>> Lex(std::string_view src) {
  std::vector<Token> out;
  size_t p = 0;
  int line = 1;
  bool line_starting = true;
  char strip_next = '\0';  // '-' after the previous tag: lstrip the next text
  while (p <= src.size()) {
    size_t t = p;
    while (true) {
      t = src.find('{', t);
      if (t == std::string_view::npos || t + 1 >= src.size()) {
        t = std::string_view::npos;
        break;
      }
      const char n = src[t + 1];
      if (n == '{' || n == '%' || n == '#') break;
      ++t;
    }
    std::string text(src.substr(p, t == std::string_view::npos ? std::string_view::npos : t - p));
    for (char c : text) line += c == '\n';
    if (strip_next == '-') {
      size_t k = 0;
      while (k < text.size() && IsSpace(text[k])) ++k;
      text.erase(0, k);
    }
    if (t == std::string_view::npos) {
      if (!text.empty()) out.push_back({Tok::kText, text, line});
      break;
    }
    const char kind = src[t + 1];
    const char ctl = t + 2 < src.size() ? src[t + 2] : '\0';
    if (ctl == '-') {
      text = RStrip(text);
    } else if (ctl != '+' && kind != '{') {
      const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if (l_pos > 0 || line_starting) {
        bool blank = l_pos < text.size();
        for (size_t k = l_pos; k < text.size(); ++k) blank = blank && IsSpace(text[k]);
        if (blank) text.resize(l_pos);
      }
    }
    if (!text.empty()) out.push_back({Tok::kText, text, line});
    p = t + 2 + ((ctl == '-' || ctl == '+') ? 1 : 0);
    char after = '\0';
    if (kind == '#') {
      const size_t e = src.find("#}", p);
      if (e == std::string_view::npos) return SyntaxError(line, "unterminated comment");
      for (size_t k = p; k < e; ++k) line += src[k] == '\n';
      after = e > p && (src[e - 1] == '-' || src[e - 1] == '+') ? src[e - 1] : '\0';
      p = e + 2;
    } else {
      out.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", line});
      absl::Status s = LexTag(src, &p, &line, kind == '{' ? "}}" : "%}", &out, &after);
      if (!s.ok()) return s;
      out.push_back({kind == '{' ? Tok::kVarEnd : Tok::kBlockEnd, "", line});
    }
    strip_next = after;
    line_starting = false;
    if (after == '-') {
      // "-%}" takes every whitespace after it (the next text is stripped).
      size_t k = p;
      while (k < src.size() && IsSpace(src[k])) ++k;
      line_starting = k > p && src[k - 1] == '\n';
    } else if (after != '+' && kind != '{' && p < src.size() && src[p] == '\n') {
      ++p;  // trim_blocks
      ++line;
      line_starting = true;
    }
  }
  out.push_back({Tok::kEof, "", line});
  return out;
}

}  // namespace

// ---------------------------------------------------------------- syntax tree

enum class N {
  // statements
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacroDef,
  kBreak,
  kContinue,
  kCall,
  // expressions
  kLiteral,
  kName,
  kList,
  kTuple,
  kDict,
  kAttr,
  kItem,
  kSlice,
  kCallExpr,
  kFilter,
  kTest,
  kUnary,
  kBinary,
  kAnd,
  kOr,
  kNot,
  kCompare,
  kCondExpr,
};

struct Template::Node {
  N type;
  int line = 0;
  std::string name;  // variable, attribute, filter, test, operator; text
  Value literal;
  std::vector<Node*> kids;            // operands / arguments
  std::vector<std::string> kw_names;  // keyword arguments: the last kw_names.size() kids
  // statements
  std::vector<std::pair<Node*, std::vector<Node*>>> branches;  // if/elif: (cond, body)
  std::vector<Node*> body, else_body;
  std::vector<std::string> targets;  // for / set targets; macro parameters
};

using Node = Template::Node;

struct Value::Macro {
  const Node* def;
};

class Parser {
 public:
  Parser(std::vector<Token> toks, Template* t) : toks_(std::move(toks)), t_(t) {}

  absl::Status ParseAll() {
    std::string end;
    absl::Status s = ParseBody({}, &t_->body_, &end);
    if (!s.ok()) return s;
    return absl::OkStatus();
  }

 private:
  Node* Make(N type, int line) {
    t_->owned_.push_back(std::make_unique<Node>());
    Node* n = t_->owned_.back().get();
    n->type = type;
    n->line = line;
    return n;
  }
  const Token& Peek(int k = 0) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  const Token& Next() { return toks_[std::min(pos_++, toks_.size() - 1)]; }
  bool IsOp(std::string_view op, int k = 0) const {
    return Peek(k).type == Tok::kOp && Peek(k).text == op;
  }
  bool IsName(std::string_view name, int k = 0) const {
    return Peek(k).type == Tok::kName && Peek(k).text == name;
  }
  absl::Status Expect(std::string_view op) {
    if (!IsOp(op)) {
      return SyntaxError(Peek().line, absl::StrCat("expected '", std::string(op), "', got '",
                                                   Describe(Peek()), "'"));
    }
    ++pos_;
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Peek().type != Tok::kBlockEnd) {
      return SyntaxError(Peek().line,
                         absl::StrCat("expected the end of the tag, got '", Describe(Peek()), "'"));
    }
    ++pos_;
    return absl::OkStatus();
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kBlockEnd:
        return "%}";
      case Tok::kVarEnd:
        return "}}";
      default:
        return t.text;
    }
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().type != Tok::kName) {
      return SyntaxError(Peek().line,
                         absl::StrCat("expected a name, got '", Describe(Peek()), "'"));
    }
    return Next().text;
  }

  // Statements until one of `ends` ({% endfor %}, {% else %}, ...), whose
  // keyword goes to *end (the tag's rest is left for the caller).
  absl::Status ParseBody(const std::vector<std::string>& ends, std::vector<Node*>* body,
                         std::string* end, int depth = 0) {
    if (depth > 100) return SyntaxError(Peek().line, "statements nested too deeply");
    while (true) {
      const Token& t = Peek();
      if (t.type == Tok::kEof) {
        if (ends.empty()) return absl::OkStatus();
        return SyntaxError(t.line, absl::StrCat("missing {% ", ends[0], " %}"));
      }
      if (t.type == Tok::kText) {
        Node* n = Make(N::kText, t.line);
        n->name = t.text;
        body->push_back(n);
        ++pos_;
        continue;
      }
      if (t.type == Tok::kVarBegin) {
        ++pos_;
        absl::StatusOr<Node*> e = ParseExpr();
        if (!e.ok()) return e.status();
        if (Peek().type != Tok::kVarEnd) {
          return SyntaxError(Peek().line,
                             absl::StrCat("expected '}}', got '", Describe(Peek()), "'"));
        }
        ++pos_;
        Node* n = Make(N::kOutput, t.line);
        n->kids.push_back(*e);
        body->push_back(n);
        continue;
      }
      if (t.type != Tok::kBlockBegin) return SyntaxError(t.line, "unexpected token");
      ++pos_;
      absl::StatusOr<std::string> kw = ExpectName();
      if (!kw.ok()) return kw.status();
      if (std::find(ends.begin(), ends.end(), *kw) != ends.end()) {
        *end = *kw;
        return absl::OkStatus();
      }
      absl::Status s = ParseStatement(*kw, t.line, body, depth);
      if (!s.ok()) return s;
    }
  }

  absl::Status ParseStatement(const std::string& kw, int line, std::vector<Node*>* body,
                              int depth) {
    if (kw == "if") {
      Node* n = Make(N::kIf, line);
      std::string end = "elif";
      while (end == "elif") {
        absl::StatusOr<Node*> cond = ParseExpr();
        if (!cond.ok()) return cond.status();
        if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
        n->branches.push_back({*cond, {}});
        if (absl::Status s =
                ParseBody({"elif", "else", "endif"}, &n->branches.back().second, &end, depth + 1);
            !s.ok()) {
          return s;
        }
      }
      if (end == "else") {
        if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
        if (absl::Status s = ParseBody({"endif"}, &n->else_body, &end, depth + 1); !s.ok())
          return s;
      }
      body->push_back(n);
      return ExpectBlockEnd();
    }
    if (kw == "for") {
      Node* n = Make(N::kFor, line);
      do {
        absl::StatusOr<std::string> name = ExpectName();
        if (!name.ok()) return name.status();
        n->targets.push_back(*name);
      } while (IsOp(",") && (++pos_, true));
      if (!IsName("in")) return SyntaxError(Peek().line, "expected 'in' in a for loop");
      ++pos_;
      absl::StatusOr<Node*> iter = ParseCondless();
      if (!iter.ok()) return iter.status();
      n->kids.push_back(*iter);
      if (IsName("if")) {
        ++pos_;
        absl::StatusOr<Node*> cond = ParseCondless();
        if (!cond.ok()) return cond.status();
        n->kids.push_back(*cond);
      }
      if (IsName("recursive")) return SyntaxError(line, "recursive loops are not supported");
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      std::string end;
      if (absl::Status s = ParseBody({"else", "endfor"}, &n->body, &end, depth + 1); !s.ok())
        return s;
      if (end == "else") {
        if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
        if (absl::Status s = ParseBody({"endfor"}, &n->else_body, &end, depth + 1); !s.ok())
          return s;
      }
      body->push_back(n);
      return ExpectBlockEnd();
    }
    if (kw == "set") {
      absl::StatusOr<std::string> name = ExpectName();
      if (!name.ok()) return name.status();
      std::vector<std::string> targets = {*name};
      if (IsOp(".")) {
        ++pos_;
        absl::StatusOr<std::string> attr = ExpectName();
        if (!attr.ok()) return attr.status();
        targets = {*name, "." + *attr};
      } else {
        while (IsOp(",")) {
          ++pos_;
          absl::StatusOr<std::string> more = ExpectName();
          if (!more.ok()) return more.status();
          targets.push_back(*more);
        }
      }
      if (Peek().type == Tok::kBlockEnd && targets.size() == 1) {
        ++pos_;
        Node* n = Make(N::kSetBlock, line);
        n->targets = targets;
        std::string end;
        if (absl::Status s = ParseBody({"endset"}, &n->body, &end, depth + 1); !s.ok()) return s;
        body->push_back(n);
        return ExpectBlockEnd();
      }
      if (absl::Status s = Expect("="); !s.ok()) return s;
      absl::StatusOr<Node*> value = ParseTupleOrExpr();
      if (!value.ok()) return value.status();
      Node* n = Make(N::kSet, line);
      n->targets = targets;
      n->kids.push_back(*value);
      body->push_back(n);
      return ExpectBlockEnd();
    }
    if (kw == "macro") {
      Node* n = Make(N::kMacroDef, line);
      absl::StatusOr<std::string> name = ExpectName();
      if (!name.ok()) return name.status();
      n->name = *name;
      if (absl::Status s = Expect("("); !s.ok()) return s;
      while (!IsOp(")")) {
        absl::StatusOr<std::string> param = ExpectName();
        if (!param.ok()) return param.status();
        n->targets.push_back(*param);
        Node* def = nullptr;
        if (IsOp("=")) {
          ++pos_;
          absl::StatusOr<Node*> d = ParseExpr();
          if (!d.ok()) return d.status();
          def = *d;
        }
        n->kids.push_back(def);
        if (!IsOp(",")) break;
        ++pos_;
      }
      if (absl::Status s = Expect(")"); !s.ok()) return s;
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      std::string end;
      if (absl::Status s = ParseBody({"endmacro"}, &n->body, &end, depth + 1); !s.ok()) return s;
      body->push_back(n);
      return ExpectBlockEnd();
    }
    if (kw == "generation") {  // transformers' assistant-mask block: its body, as is
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      std::string end;
      if (absl::Status s = ParseBody({"endgeneration"}, body, &end, depth + 1); !s.ok()) return s;
      return ExpectBlockEnd();
    }
    if (kw == "break" || kw == "continue") {
      body->push_back(Make(kw == "break" ? N::kBreak : N::kContinue, line));
      return ExpectBlockEnd();
    }
    if (kw == "do") {
      absl::StatusOr<Node*> e = ParseExpr();
      if (!e.ok()) return e.status();
      Node* n = Make(N::kCall, line);
      n->kids.push_back(*e);
      body->push_back(n);
      return ExpectBlockEnd();
    }
    return SyntaxError(line, absl::StrCat("unknown or unsupported tag '", kw, "'"));
  }

  // ---- expressions (jinja2's grammar and precedence)

  absl::StatusOr<Node*> ParseTupleOrExpr() {
    const int line = Peek().line;
    absl::StatusOr<Node*> first = ParseExpr();
    if (!first.ok() || !IsOp(",")) return first;
    Node* t = Make(N::kTuple, line);
    t->kids.push_back(*first);
    while (IsOp(",")) {
      ++pos_;
      if (Peek().type == Tok::kBlockEnd) break;
      absl::StatusOr<Node*> e = ParseExpr();
      if (!e.ok()) return e.status();
      t->kids.push_back(*e);
    }
    return t;
  }

  absl::StatusOr<Node*> ParseExpr() {
    if (++depth_ > 200) return SyntaxError(Peek().line, "expression nested too deeply");
    absl::StatusOr<Node*> e = ParseCondExpr();
    --depth_;
    return e;
  }

  absl::StatusOr<Node*> ParseCondExpr() {
    absl::StatusOr<Node*> a = ParseOr();
    if (!a.ok()) return a;
    while (IsName("if")) {
      const int line = Next().line;
      absl::StatusOr<Node*> cond = ParseOr();
      if (!cond.ok()) return cond;
      Node* n = Make(N::kCondExpr, line);
      n->kids = {*a, *cond, nullptr};
      if (IsName("else")) {
        ++pos_;
        absl::StatusOr<Node*> b = ParseCondExpr();
        if (!b.ok()) return b;
        n->kids[2] = *b;
      }
      a = n;
    }
    return a;
  }
  // An expression without a top-level "x if c else y" (for loops' iterables).
  absl::StatusOr<Node*> ParseCondless() { return ParseOr(); }

  absl::StatusOr<Node*> ParseOr() {
    absl::StatusOr<Node*> a = ParseAnd();
    while (a.ok() && IsName("or")) {
      const int line = Next().line;
      absl::StatusOr<Node*> b = ParseAnd();
      if (!b.ok()) return b;
      Node* n = Make(N::kOr, line);
      n->kids = {*a, *b};
      a = n;
    }
    return a;
  }
  absl::StatusOr<Node*> ParseAnd() {
    absl::StatusOr<Node*> a = ParseNot();
    while (a.ok() && IsName("and")) {
      const int line = Next().line;
      absl::StatusOr<Node*> b = ParseNot();
      if (!b.ok()) return b;
      Node* n = Make(N::kAnd, line);
      n->kids = {*a, *b};
      a = n;
    }
    return a;
  }
  absl::StatusOr<Node*> ParseNot() {
    if (IsName("not")) {
      const int line = Next().line;
      if (++depth_ > 200) return SyntaxError(line, "expression nested too deeply");
      absl::StatusOr<Node*> a = ParseNot();
      --depth_;
      if (!a.ok()) return a;
      Node* n = Make(N::kNot, line);
      n->kids = {*a};
      return n;
    }
    return ParseCompare();
  }
  absl::StatusOr<Node*> ParseCompare() {
    const int line = Peek().line;
    absl::StatusOr<Node*> a = ParseMath1();
    if (!a.ok()) return a;
    Node* cmp = nullptr;
    while (true) {
      std::string op;
      if (Peek().type == Tok::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        ++pos_;
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        pos_ += 2;
        op = "notin";
      } else {
        break;
      }
      absl::StatusOr<Node*> b = ParseMath1();
      if (!b.ok()) return b;
      if (cmp == nullptr) {
        cmp = Make(N::kCompare, line);
        cmp->kids.push_back(*a);
      }
      cmp->kw_names.push_back(op);
      cmp->kids.push_back(*b);
    }
    return cmp == nullptr ? *a : cmp;
  }
  absl::StatusOr<Node*> Binary(const std::vector<std::string>& ops,
                               absl::StatusOr<Node*> (Parser::*next)()) {
    absl::StatusOr<Node*> a = (this->*next)();
    while (a.ok() && Peek().type == Tok::kOp &&
           std::find(ops.begin(), ops.end(), Peek().text) != ops.end()) {
      const Token& op = Next();
      absl::StatusOr<Node*> b = (this->*next)();
      if (!b.ok()) return b;
      Node* n = Make(N::kBinary, op.line);
      n->name = op.text;
      n->kids = {*a, *b};
      a = n;
    }
    return a;
  }
  absl::StatusOr<Node*> ParseMath1() { return Binary({"+", "-"}, &Parser::ParseConcat); }
  absl::StatusOr<Node*> ParseConcat() { return Binary({"~"}, &Parser::ParseMath2); }
  absl::StatusOr<Node*> ParseMath2() { return Binary({"*", "/", "//", "%"}, &Parser::ParsePow); }
  absl::StatusOr<Node*> ParsePow() { return Binary({"**"}, &Parser::ParseUnaryFiltered); }
  absl::StatusOr<Node*> ParseUnaryFiltered() { return ParseUnary(true); }

  absl::StatusOr<Node*> ParseUnary(bool with_filter) {
    absl::StatusOr<Node*> a;
    if (IsOp("-") || IsOp("+")) {
      const Token& op = Next();
      if (++depth_ > 200) return SyntaxError(op.line, "expression nested too deeply");
      absl::StatusOr<Node*> x = ParseUnary(false);
      --depth_;
      if (!x.ok()) return x;
      Node* n = Make(N::kUnary, op.line);
      n->name = op.text;
      n->kids = {*x};
      a = n;
    } else {
      a = ParsePrimary();
      if (!a.ok()) return a;
      a = ParsePostfix(*a);
    }
    if (!a.ok() || !with_filter) return a;
    return ParseFilterExpr(*a);
  }

  absl::StatusOr<Node*> ParsePrimary() {
    const Token& t = Next();
    switch (t.type) {
      case Tok::kName: {
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          Node* n = Make(N::kLiteral, t.line);
          n->literal = Value::Bool(t.text[0] == 't' || t.text[0] == 'T');
          return n;
        }
        if (t.text == "none" || t.text == "None") {
          Node* n = Make(N::kLiteral, t.line);
          n->literal = Value::None();
          return n;
        }
        Node* n = Make(N::kName, t.line);
        n->name = t.text;
        return n;
      }
      case Tok::kString: {
        std::string s = t.text;
        while (Peek().type == Tok::kString) s += Next().text;  // "a" "b" is "ab"
        Node* n = Make(N::kLiteral, t.line);
        n->literal = Value::String(s);
        return n;
      }
      case Tok::kInt: {
        Node* n = Make(N::kLiteral, t.line);
        errno = 0;
        const long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno != 0) return SyntaxError(t.line, "integer literal out of range");
        n->literal = Value::Int(v);
        return n;
      }
      case Tok::kFloat: {
        Node* n = Make(N::kLiteral, t.line);
        n->literal = Value::Float(std::strtod(t.text.c_str(), nullptr));
        return n;
      }
      case Tok::kOp:
        if (t.text == "(") {
          if (IsOp(")")) {
            ++pos_;
            return Make(N::kTuple, t.line);
          }
          absl::StatusOr<Node*> e = ParseExpr();
          if (!e.ok()) return e;
          if (IsOp(",")) {
            Node* tup = Make(N::kTuple, t.line);
            tup->kids.push_back(*e);
            while (IsOp(",")) {
              ++pos_;
              if (IsOp(")")) break;
              absl::StatusOr<Node*> x = ParseExpr();
              if (!x.ok()) return x;
              tup->kids.push_back(*x);
            }
            e = tup;
          }
          if (absl::Status s = Expect(")"); !s.ok()) return s;
          return e;
        }
        if (t.text == "[") {
          Node* n = Make(N::kList, t.line);
          while (!IsOp("]")) {
            absl::StatusOr<Node*> e = ParseExpr();
            if (!e.ok()) return e;
            n->kids.push_back(*e);
            if (!IsOp(",")) break;
            ++pos_;
          }
          if (absl::Status s = Expect("]"); !s.ok()) return s;
          return n;
        }
        if (t.text == "{") {
          Node* n = Make(N::kDict, t.line);
          while (!IsOp("}")) {
            absl::StatusOr<Node*> k = ParseExpr();
            if (!k.ok()) return k;
            if (absl::Status s = Expect(":"); !s.ok()) return s;
            absl::StatusOr<Node*> v = ParseExpr();
            if (!v.ok()) return v;
            n->kids.push_back(*k);
            n->kids.push_back(*v);
            if (!IsOp(",")) break;
            ++pos_;
          }
          if (absl::Status s = Expect("}"); !s.ok()) return s;
          return n;
        }
        break;
      default:
        break;
    }
    return SyntaxError(t.line, absl::StrCat("unexpected '", Describe(t), "'"));
  }

  absl::Status ParseArgs(Node* call) {
    // after '('
    while (!IsOp(")")) {
      if (Peek().type == Tok::kName && IsOp("=", 1)) {
        call->kw_names.push_back(Next().text);
        ++pos_;
      } else if (!call->kw_names.empty()) {
        return SyntaxError(Peek().line, "positional argument after a keyword argument");
      }
      absl::StatusOr<Node*> e = ParseExpr();
      if (!e.ok()) return e.status();
      call->kids.push_back(*e);
      if (!IsOp(",")) break;
      ++pos_;
    }
    return Expect(")");
  }

  absl::StatusOr<Node*> ParsePostfix(Node* a) {
    while (true) {
      if (IsOp(".")) {
        const int line = Next().line;
        Node* n = Make(N::kAttr, line);
        if (Peek().type == Tok::kInt) {  // x.0 is x[0]
          n->type = N::kItem;
          Node* idx = Make(N::kLiteral, line);
          idx->literal = Value::Int(std::strtoll(Next().text.c_str(), nullptr, 10));
          n->kids = {a, idx};
        } else {
          absl::StatusOr<std::string> name = ExpectName();
          if (!name.ok()) return name.status();
          n->name = *name;
          n->kids = {a};
        }
        a = n;
      } else if (IsOp("[")) {
        const int line = Next().line;
        Node* parts[3] = {nullptr, nullptr, nullptr};
        int k = 0;
        bool slice = false;
        while (!IsOp("]")) {
          if (IsOp(":")) {
            ++pos_;
            slice = true;
            if (++k > 2) return SyntaxError(line, "a slice has at most three parts");
            continue;
          }
          absl::StatusOr<Node*> e = ParseExpr();
          if (!e.ok()) return e;
          parts[k] = *e;
          if (!IsOp(":") && !IsOp("]")) return SyntaxError(Peek().line, "expected ']'");
        }
        ++pos_;
        Node* n = Make(slice ? N::kSlice : N::kItem, line);
        if (slice) {
          n->kids = {a, parts[0], parts[1], parts[2]};
        } else {
          if (parts[0] == nullptr) return SyntaxError(line, "empty subscript");
          n->kids = {a, parts[0]};
        }
        a = n;
      } else if (IsOp("(")) {
        const int line = Next().line;
        Node* n = Make(N::kCallExpr, line);
        n->kids.push_back(a);
        if (absl::Status s = ParseArgs(n); !s.ok()) return s;
        a = n;
      } else {
        return a;
      }
    }
  }

  absl::StatusOr<Node*> ParseFilterExpr(Node* a) {
    while (true) {
      if (IsOp("|")) {
        const int line = Next().line;
        absl::StatusOr<std::string> name = ExpectName();
        if (!name.ok()) return name.status();
        Node* n = Make(N::kFilter, line);
        n->name = *name;
        n->kids.push_back(a);
        if (IsOp("(")) {
          ++pos_;
          if (absl::Status s = ParseArgs(n); !s.ok()) return s;
        }
        a = n;
      } else if (IsName("is")) {
        const int line = Next().line;
        bool negated = false;
        if (IsName("not")) {
          ++pos_;
          negated = true;
        }
        absl::StatusOr<std::string> name = ExpectName();
        if (!name.ok()) return name.status();
        Node* n = Make(N::kTest, line);
        n->name = *name;
        n->kids.push_back(a);
        if (IsOp("(")) {
          ++pos_;
          if (absl::Status s = ParseArgs(n); !s.ok()) return s;
        } else if (Peek().type == Tok::kString || Peek().type == Tok::kInt ||
                   Peek().type == Tok::kFloat ||
                   (Peek().type == Tok::kName && !IsName("and") && !IsName("or") &&
                    !IsName("else") && !IsName("if") && !IsName("in") && !IsName("is") &&
                    !IsName("not"))) {
          absl::StatusOr<Node*> arg = ParsePrimary();  // "x is divisibleby 3", "x is sameas none"
          if (!arg.ok()) return arg;
          n->kids.push_back(*arg);
        }
        if (negated) {
          Node* nn = Make(N::kNot, line);
          nn->kids = {n};
          n = nn;
        }
        a = n;
      } else {
        return a;
      }
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  Template* t_;
};

Template::Template() = default;
Template::~Template() = default;

absl::StatusOr<std::unique_ptr<Template>> Template::Parse(std::string_view source, Limits limits) {
  absl::StatusOr<std::vector<Token>> toks = Lex(source);
  if (!toks.ok()) return toks.status();
  std::unique_ptr<Template> t(new Template());
  t->limits_ = limits;
  Parser p(std::move(*toks), t.get());
  if (absl::Status s = p.ParseAll(); !s.ok()) return s;
  return t;
}

// ---------------------------------------------------------------- evaluation

namespace {

// Code points of UTF-8 text (invalid bytes pass as themselves).
std::vector<std::string> CodePoints(const std::string& s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - k);
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

// Python's str.isspace() code points in UTF-8 (ASCII and the common others).
size_t SpaceAt(const std::string& s, size_t k) {
  const unsigned char c = static_cast<unsigned char>(s[k]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  for (const char* u :
       {"\xc2\x85", "\xc2\xa0", "\xe3\x80\x80", "\xe2\x80\xa8", "\xe2\x80\xa9", "\xe2\x80\x80",
        "\xe2\x80\x81", "\xe2\x80\x82", "\xe2\x80\x83", "\xe2\x80\x84", "\xe2\x80\x85",
        "\xe2\x80\x86", "\xe2\x80\x87", "\xe2\x80\x88", "\xe2\x80\x89", "\xe2\x80\x8a",
        "\xe1\x9a\x80", "\xe2\x80\xaf", "\xe2\x81\x9f"}) {
    const size_t n = std::strlen(u);
    if (s.compare(k, n, u) == 0) return n;
  }
  return 0;
}

std::string PyStrip(const std::string& s, const Value* chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (chars == nullptr || chars->is_none() || chars->is_undefined()) {
    while (left && b < e) {
      const size_t n = SpaceAt(s, b);
      if (n == 0) break;
      b += n;
    }
    while (right && e > b) {
      size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      if (SpaceAt(s, k) != e - k) break;
      e = k;
    }
    return s.substr(b, e - b);
  }
  const std::vector<std::string> set = CodePoints(chars->s());
  auto in = [&](const std::string& cp) {
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  std::vector<std::string> cps = CodePoints(s);
  size_t lb = 0, le = cps.size();
  while (left && lb < le && in(cps[lb])) ++lb;
  while (right && le > lb && in(cps[le - 1])) --le;
  std::string out;
  for (size_t k = lb; k < le; ++k) out += cps[k];
  return out;
}

struct Flow {
  enum Kind { kNormal, kBreak, kContinue } kind = kNormal;
};

class Renderer {
 public:
  Renderer(const Limits& limits, const std::map<std::string, Value>& vars) : limits_(limits) {
    scopes_.emplace_back(vars.begin(), vars.end());
  }

  absl::Status Run(const std::vector<Node*>& body, std::string* out) {
    Flow f;
    return Exec(body, out, &f);
  }

 private:
  using Scope = std::map<std::string, Value>;

  absl::Status Error(const Node* n, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("template line ", n->line, ": ", what));
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value();
  }

  absl::Status Exec(const std::vector<Node*>& body, std::string* out, Flow* flow) {
    for (const Node* n : body) {
      if (absl::Status s = ExecOne(n, out, flow); !s.ok()) return s;
      if (flow->kind != Flow::kNormal) return absl::OkStatus();
      if (static_cast<int64_t>(out->size()) > limits_.max_output_bytes) {
        return Error(n, absl::StrCat("output past ", limits_.max_output_bytes, " bytes"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ExecOne(const Node* n, std::string* out, Flow* flow) {
    switch (n->type) {
      case N::kText:
        *out += n->name;
        return absl::OkStatus();
      case N::kOutput: {
        absl::StatusOr<Value> v = Eval(n->kids[0]);
        if (!v.ok()) return v.status();
        *out += v->Str();
        return absl::OkStatus();
      }
      case N::kIf:
        for (const auto& [cond, body] : n->branches) {
          absl::StatusOr<Value> c = Eval(cond);
          if (!c.ok()) return c.status();
          if (c->Truthy()) return Exec(body, out, flow);
        }
        return Exec(n->else_body, out, flow);
      case N::kFor:
        return ExecFor(n, out, flow);
      case N::kSet: {
        absl::StatusOr<Value> v = Eval(n->kids[0]);
        if (!v.ok()) return v.status();
        return Assign(n, *v);
      }
      case N::kSetBlock: {
        std::string captured;
        Flow f;
        if (absl::Status s = Exec(n->body, &captured, &f); !s.ok()) return s;
        scopes_.back()[n->targets[0]] = Value::String(captured);
        return absl::OkStatus();
      }
      case N::kMacroDef:
        scopes_.back()[n->name] = Value::MacroOf(std::make_shared<Value::Macro>(Value::Macro{n}));
        return absl::OkStatus();
      case N::kBreak:
        flow->kind = Flow::kBreak;
        return absl::OkStatus();
      case N::kContinue:
        flow->kind = Flow::kContinue;
        return absl::OkStatus();
      case N::kCall:
        return Eval(n->kids[0]).status();
      default:
        return Error(n, "not a statement");
    }
  }

  absl::Status Assign(const Node* n, const Value& v) {
    if (n->targets.size() == 2 && n->targets[1][0] == '.') {
      Value ns = Lookup(n->targets[0]);
      if (!ns.is_namespace()) {
        return Error(n, absl::StrCat("cannot assign an attribute of '", n->targets[0],
                                     "': only a namespace() takes attribute assignment"));
      }
      ns.Set(n->targets[1].substr(1), v);
      return absl::OkStatus();
    }
    if (n->targets.size() == 1) {
      scopes_.back()[n->targets[0]] = v;
      return absl::OkStatus();
    }
    if (!v.is_list() || v.list().size() != n->targets.size()) {
      return Error(n,
                   absl::StrCat("cannot unpack ", v.Repr(), " into ", n->targets.size(), " names"));
    }
    for (size_t k = 0; k < n->targets.size(); ++k) scopes_.back()[n->targets[k]] = v.list()[k];
    return absl::OkStatus();
  }

  absl::StatusOr<Value::List> Iterate(const Node* n, const Value& v) const {
    switch (v.kind()) {
      case Value::Kind::kList:
        return v.list();
      case Value::Kind::kString: {
        Value::List l;
        for (std::string& cp : CodePoints(v.s())) l.push_back(Value::String(std::move(cp)));
        return l;
      }
      case Value::Kind::kDict: {
        Value::List l;
        for (const auto& [k, x] : v.dict()) l.push_back(Value::String(k));
        return l;
      }
      case Value::Kind::kUndefined:
        return Value::List();
      default:
        return Error(n, absl::StrCat("'", v.Repr(), "' is not iterable"));
    }
  }

  absl::Status ExecFor(const Node* n, std::string* out, Flow* /*outer*/) {
    absl::StatusOr<Value> seq = Eval(n->kids[0]);
    if (!seq.ok()) return seq.status();
    absl::StatusOr<Value::List> all = Iterate(n, *seq);
    if (!all.ok()) return all.status();
    Value::List items;
    if (n->kids.size() > 1) {  // {% for x in y if cond %}
      for (const Value& item : *all) {
        scopes_.emplace_back();
        absl::Status bound = Bind(n, item);
        absl::StatusOr<Value> keep = bound.ok() ? Eval(n->kids[1]) : absl::StatusOr<Value>(bound);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) items.push_back(item);
      }
    } else {
      items = std::move(*all);
    }
    if (items.empty()) {
      Flow f;
      return Exec(n->else_body, out, &f);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      if (++iterations_ > limits_.max_loop_iterations) {
        return Error(n,
                     absl::StrCat("more than ", limits_.max_loop_iterations, " loop iterations"));
      }
      scopes_.emplace_back();
      Value::Dict loop = {
          {"index", Value::Int(k + 1)},      {"index0", Value::Int(k)},
          {"revindex", Value::Int(len - k)}, {"revindex0", Value::Int(len - k - 1)},
          {"first", Value::Bool(k == 0)},    {"last", Value::Bool(k == len - 1)},
          {"length", Value::Int(len)},       {"depth", Value::Int(1)},
          {"depth0", Value::Int(0)},
      };
      if (k > 0) loop.emplace_back("previtem", items[static_cast<size_t>(k - 1)]);
      if (k + 1 < len) loop.emplace_back("nextitem", items[static_cast<size_t>(k + 1)]);
      scopes_.back()["loop"] = Value::DictOf(std::move(loop));
      absl::Status s = Bind(n, items[static_cast<size_t>(k)]);
      Flow f;
      if (s.ok()) s = Exec(n->body, out, &f);
      scopes_.pop_back();
      if (!s.ok()) return s;
      if (f.kind == Flow::kBreak) break;
    }
    return absl::OkStatus();
  }

  absl::Status Bind(const Node* n, const Value& item) {
    if (n->targets.size() == 1) {
      scopes_.back()[n->targets[0]] = item;
      return absl::OkStatus();
    }
    if (!item.is_list() || item.list().size() != n->targets.size()) {
      return Error(
          n, absl::StrCat("cannot unpack ", item.Repr(), " into ", n->targets.size(), " names"));
    }
    for (size_t k = 0; k < n->targets.size(); ++k) scopes_.back()[n->targets[k]] = item.list()[k];
    return absl::OkStatus();
  }

  // ---- expressions

  absl::StatusOr<Value> Eval(const Node* n) {
    if (++depth_ > limits_.max_depth) {
      --depth_;
      return Error(n, "nested too deeply");
    }
    absl::StatusOr<Value> v = EvalInner(n);
    --depth_;
    return v;
  }

  absl::StatusOr<std::vector<Value>> EvalAll(const std::vector<Node*>& kids, size_t from) {
    std::vector<Value> out;
    for (size_t k = from; k < kids.size(); ++k) {
      absl::StatusOr<Value> v = Eval(kids[k]);
      if (!v.ok()) return v.status();
      out.push_back(std::move(*v));
    }
    return out;
  }

  absl::StatusOr<Value> EvalInner(const Node* n) {
    switch (n->type) {
      case N::kLiteral:
        return n->literal;
      case N::kName:
        return Lookup(n->name);
      case N::kList:
      case N::kTuple: {
        absl::StatusOr<std::vector<Value>> items = EvalAll(n->kids, 0);
        if (!items.ok()) return items.status();
        return n->type == N::kTuple ? Value::TupleOf(std::move(*items))
                                    : Value::ListOf(std::move(*items));
      }
      case N::kDict: {
        Value d = Value::DictOf({});
        for (size_t k = 0; k + 1 < n->kids.size(); k += 2) {
          absl::StatusOr<Value> key = Eval(n->kids[k]);
          if (!key.ok()) return key.status();
          if (!key->is_string()) return Error(n, "dict keys must be strings");
          absl::StatusOr<Value> v = Eval(n->kids[k + 1]);
          if (!v.ok()) return v.status();
          d.Set(key->s(), *v);
        }
        return d;
      }
      case N::kAttr: {
        absl::StatusOr<Value> obj = Eval(n->kids[0]);
        if (!obj.ok()) return obj;
        return GetAttr(n, *obj, n->name);
      }
      case N::kItem: {
        absl::StatusOr<Value> obj = Eval(n->kids[0]);
        if (!obj.ok()) return obj;
        absl::StatusOr<Value> key = Eval(n->kids[1]);
        if (!key.ok()) return key;
        return GetItem(n, *obj, *key);
      }
      case N::kSlice:
        return EvalSlice(n);
      case N::kCallExpr:
        return EvalCall(n);
      case N::kFilter:
        return EvalFilter(n);
      case N::kTest: {
        absl::StatusOr<bool> t = EvalTest(n);
        if (!t.ok()) return t.status();
        return Value::Bool(*t);
      }
      case N::kUnary: {
        absl::StatusOr<Value> x = Eval(n->kids[0]);
        if (!x.ok()) return x;
        if (x->kind() == Value::Kind::kBool) *x = Value::Int(x->b());
        if (!x->is_number())
          return Error(n, absl::StrCat("bad operand for unary ", n->name, ": ", x->Repr()));
        if (n->name == "+") return *x;
        return x->kind() == Value::Kind::kInt ? Value::Int(-x->i()) : Value::Float(-x->f());
      }
      case N::kBinary:
        return EvalBinary(n);
      case N::kAnd: {
        absl::StatusOr<Value> a = Eval(n->kids[0]);
        if (!a.ok() || !a->Truthy()) return a;
        return Eval(n->kids[1]);
      }
      case N::kOr: {
        absl::StatusOr<Value> a = Eval(n->kids[0]);
        if (!a.ok() || a->Truthy()) return a;
        return Eval(n->kids[1]);
      }
      case N::kNot: {
        absl::StatusOr<Value> a = Eval(n->kids[0]);
        if (!a.ok()) return a;
        return Value::Bool(!a->Truthy());
      }
      case N::kCompare:
        return EvalCompare(n);
      case N::kCondExpr: {
        absl::StatusOr<Value> c = Eval(n->kids[1]);
        if (!c.ok()) return c;
        if (c->Truthy()) return Eval(n->kids[0]);
        if (n->kids[2] == nullptr) return Value();
        return Eval(n->kids[2]);
      }
      default:
        return Error(n, "not an expression");
    }
  }

  absl::StatusOr<Value> GetAttr(const Node* n, const Value& obj, const std::string& name) {
    if (obj.is_undefined())
      return Error(n, absl::StrCat("undefined value has no attribute '", name, "'"));
    if (obj.is_dict()) {
      const Value* v = obj.Find(name);
      if (v != nullptr) return *v;
    }
    return Value();  // jinja: a missing attribute is undefined (methods are called, not read)
  }

  absl::StatusOr<Value> GetItem(const Node* n, const Value& obj, const Value& key) {
    if (obj.is_undefined())
      return Error(n, absl::StrCat("undefined value has no item ", key.Repr()));
    if (obj.is_dict()) {
      if (!key.is_string()) return Value();
      const Value* v = obj.Find(key.s());
      return v != nullptr ? *v : Value();
    }
    if ((obj.is_list() || obj.is_string()) && key.kind() == Value::Kind::kInt) {
      if (obj.is_list()) {
        const int64_t len = static_cast<int64_t>(obj.list().size());
        const int64_t i = key.i() < 0 ? key.i() + len : key.i();
        if (i < 0 || i >= len) return Value();
        return obj.list()[static_cast<size_t>(i)];
      }
      const std::vector<std::string> cps = CodePoints(obj.s());
      const int64_t len = static_cast<int64_t>(cps.size());
      const int64_t i = key.i() < 0 ? key.i() + len : key.i();
      if (i < 0 || i >= len) return Value();
      return Value::String(cps[static_cast<size_t>(i)]);
    }
    if (key.is_string()) return GetAttr(n, obj, key.s());
    return Value();
  }

  absl::StatusOr<Value> EvalSlice(const Node* n) {
    absl::StatusOr<Value> obj = Eval(n->kids[0]);
    if (!obj.ok()) return obj;
    std::optional<int64_t> parts[3];
    for (int k = 0; k < 3; ++k) {
      if (n->kids[k + 1] == nullptr) continue;
      absl::StatusOr<Value> v = Eval(n->kids[k + 1]);
      if (!v.ok()) return v;
      if (v->is_none()) continue;
      if (v->kind() != Value::Kind::kInt) return Error(n, "slice indices must be integers");
      parts[k] = v->i();
    }
    std::vector<Value> items;
    std::vector<std::string> cps;
    if (obj->is_list()) {
      items = obj->list();
    } else if (obj->is_string()) {
      cps = CodePoints(obj->s());
    } else {
      return Error(n, absl::StrCat("cannot slice ", obj->Repr()));
    }
    const int64_t len = static_cast<int64_t>(obj->is_list() ? items.size() : cps.size());
    const int64_t step = parts[2].value_or(1);
    if (step == 0) return Error(n, "slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> x, int64_t def, bool is_start) {
      if (!x) return def;
      int64_t v = *x < 0 ? *x + len : *x;
      if (step > 0) return std::clamp<int64_t>(v, 0, len);
      (void)is_start;
      return std::clamp<int64_t>(v, -1, len - 1);
    };
    const int64_t start = clamp(parts[0], step > 0 ? 0 : len - 1, true);
    const int64_t stop = clamp(parts[1], step > 0 ? len : -1, false);
    Value::List out_list;
    std::string out_str;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (obj->is_list()) {
        out_list.push_back(items[static_cast<size_t>(i)]);
      } else {
        out_str += cps[static_cast<size_t>(i)];
      }
    }
    return obj->is_list() ? Value::ListOf(std::move(out_list)) : Value::String(std::move(out_str));
  }

  absl::StatusOr<Value> EvalBinary(const Node* n) {
    absl::StatusOr<Value> pa = Eval(n->kids[0]);
    if (!pa.ok()) return pa;
    absl::StatusOr<Value> pb = Eval(n->kids[1]);
    if (!pb.ok()) return pb;
    Value a = *pa, b = *pb;
    const std::string& op = n->name;
    if (op == "~") return Value::String(a.Str() + b.Str());
    if (a.kind() == Value::Kind::kBool) a = Value::Int(a.b());
    if (b.kind() == Value::Kind::kBool) b = Value::Int(b.b());
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value::String(a.s() + b.s());
      if (a.is_list() && b.is_list()) {
        Value::List l = a.list();
        l.insert(l.end(), b.list().begin(), b.list().end());
        return Value::ListOf(std::move(l));
      }
    }
    if (op == "*" && (a.is_string() || a.is_list()) && b.kind() == Value::Kind::kInt)
      std::swap(a, b);
    if (op == "*" && a.kind() == Value::Kind::kInt && (b.is_string() || b.is_list())) {
      if (a.i() * static_cast<int64_t>(b.is_string() ? b.s().size() : b.list().size()) >
          limits_.max_output_bytes) {
        return Error(n, "repetition too large");
      }
      if (b.is_string()) {
        std::string s;
        for (int64_t k = 0; k < a.i(); ++k) s += b.s();
        return Value::String(s);
      }
      Value::List l;
      for (int64_t k = 0; k < a.i(); ++k) l.insert(l.end(), b.list().begin(), b.list().end());
      return Value::ListOf(std::move(l));
    }
    if (!a.is_number() || !b.is_number()) {
      return Error(
          n, absl::StrCat("unsupported operand types for ", op, ": ", a.Repr(), " and ", b.Repr()));
    }
    const bool ints = a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt;
    if (op == "/") {
      if (b.f() == 0) return Error(n, "division by zero");
      return Value::Float(a.f() / b.f());
    }
    if (op == "//" || op == "%") {
      if (b.f() == 0) return Error(n, "division by zero");
      if (ints) {
        int64_t q = a.i() / b.i(), r = a.i() % b.i();
        if (r != 0 && ((r < 0) != (b.i() < 0))) {
          --q;
          r += b.i();
        }
        return Value::Int(op == "//" ? q : r);
      }
      const double q = std::floor(a.f() / b.f());
      return Value::Float(op == "//" ? q : a.f() - q * b.f());
    }
    if (op == "**") {
      if (ints && b.i() >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < b.i(); ++k) {
          if (__builtin_mul_overflow(r, a.i(), &r)) return Error(n, "integer overflow");
        }
        return Value::Int(r);
      }
      return Value::Float(std::pow(a.f(), b.f()));
    }
    if (ints) {
      int64_t r = 0;
      bool overflow = op == "+"   ? __builtin_add_overflow(a.i(), b.i(), &r)
                      : op == "-" ? __builtin_sub_overflow(a.i(), b.i(), &r)
                                  : __builtin_mul_overflow(a.i(), b.i(), &r);
      if (overflow) return Error(n, "integer overflow");
      return Value::Int(r);
    }
    return Value::Float(op == "+" ? a.f() + b.f() : op == "-" ? a.f() - b.f() : a.f() * b.f());
  }

  absl::StatusOr<bool> Contains(const Node* n, const Value& item, const Value& seq) {
    if (seq.is_string()) {
      if (!item.is_string()) return Error(n, "'in <string>' requires a string on the left");
      return seq.s().find(item.s()) != std::string::npos;
    }
    if (seq.is_dict()) return item.is_string() && seq.Find(item.s()) != nullptr;
    if (seq.is_list()) {
      for (const Value& v : seq.list()) {
        if (Equal(v, item)) return true;
      }
      return false;
    }
    if (seq.is_undefined()) return false;
    return Error(n, absl::StrCat("argument of type ", seq.Repr(), " is not iterable"));
  }

  absl::StatusOr<int> Order(const Node* n, const Value& a, const Value& b) {
    if ((a.is_number() || a.kind() == Value::Kind::kBool) &&
        (b.is_number() || b.kind() == Value::Kind::kBool)) {
      const double x = a.kind() == Value::Kind::kBool ? a.b() : a.f();
      const double y = b.kind() == Value::Kind::kBool ? b.b() : b.f();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) return a.s() < b.s() ? -1 : a.s() > b.s() ? 1 : 0;
    if (a.is_list() && b.is_list()) {
      for (size_t k = 0; k < std::min(a.list().size(), b.list().size()); ++k) {
        absl::StatusOr<int> c = Order(n, a.list()[k], b.list()[k]);
        if (!c.ok() || *c != 0) return c;
      }
      return a.list().size() < b.list().size() ? -1 : a.list().size() > b.list().size() ? 1 : 0;
    }
    return Error(n, absl::StrCat("cannot order ", a.Repr(), " and ", b.Repr()));
  }

  absl::StatusOr<Value> EvalCompare(const Node* n) {
    absl::StatusOr<Value> a = Eval(n->kids[0]);
    if (!a.ok()) return a;
    for (size_t k = 1; k < n->kids.size(); ++k) {
      absl::StatusOr<Value> b = Eval(n->kids[k]);
      if (!b.ok()) return b;
      const std::string& op = n->kw_names[k - 1];
      bool r = false;
      if (op == "==" || op == "!=") {
        r = Equal(*a, *b) == (op == "==");
      } else if (op == "in" || op == "notin") {
        absl::StatusOr<bool> c = Contains(n, *a, *b);
        if (!c.ok()) return c.status();
        r = *c == (op == "in");
      } else {
        absl::StatusOr<int> c = Order(n, *a, *b);
        if (!c.ok()) return c.status();
        r = op == "<" ? *c < 0 : op == ">" ? *c > 0 : op == "<=" ? *c <= 0 : *c >= 0;
      }
      if (!r) return Value::Bool(false);
      a = b;
    }
    return Value::Bool(true);
  }

  // Positional and keyword arguments of a call or filter (from kids[first]).
  struct Args {
    std::vector<Value> pos;
    std::map<std::string, Value> kw;
    const Value* Get(size_t i, const std::string& name) const {
      if (i < pos.size()) return &pos[i];
      auto it = kw.find(name);
      return it == kw.end() ? nullptr : &it->second;
    }
  };
  absl::StatusOr<Args> EvalArgs(const Node* n, size_t first) {
    absl::StatusOr<std::vector<Value>> all = EvalAll(n->kids, first);
    if (!all.ok()) return all.status();
    Args a;
    const size_t npos = all->size() - n->kw_names.size();
    for (size_t k = 0; k < all->size(); ++k) {
      if (k < npos) {
        a.pos.push_back((*all)[k]);
      } else {
        a.kw[n->kw_names[k - npos]] = (*all)[k];
      }
    }
    return a;
  }

  absl::StatusOr<Value> EvalCall(const Node* n) {
    const Node* callee = n->kids[0];
    absl::StatusOr<Args> args = EvalArgs(n, 1);
    if (!args.ok()) return args.status();
    if (callee->type == N::kAttr) {
      absl::StatusOr<Value> obj = Eval(callee->kids[0]);
      if (!obj.ok()) return obj;
      if (obj->is_dict() && !obj->is_namespace() && obj->Find(callee->name) != nullptr &&
          obj->Find(callee->name)->kind() == Value::Kind::kMacro) {
        return CallMacro(n, *obj->Find(callee->name), *args);
      }
      return CallMethod(n, *obj, callee->name, *args);
    }
    if (callee->type == N::kName) {
      const std::string& f = callee->name;
      Value v = Lookup(f);
      if (v.kind() == Value::Kind::kMacro) return CallMacro(n, v, *args);
      if (v.is_undefined()) {
        if (f == "raise_exception") {
          const Value* m = args->Get(0, "message");
          return absl::FailedPreconditionError(m == nullptr ? std::string("raise_exception()")
                                                            : m->Str());
        }
        if (f == "namespace") {
          Value::Dict d;
          if (!args->pos.empty()) {
            if (!args->pos[0].is_dict()) return Error(n, "namespace() takes a dict or keywords");
            d = args->pos[0].dict();
          }
          for (const auto& [k, x] : args->kw) d.emplace_back(k, x);
          return Value::Namespace(std::move(d));
        }
        if (f == "range") return Range(n, *args);
        if (f == "strftime_now") {
          const Value* fmt = args->Get(0, "format");
          if (fmt == nullptr || !fmt->is_string())
            return Error(n, "strftime_now(format) takes a string");
          const std::time_t now = std::time(nullptr);
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[256];
          const size_t len = std::strftime(buf, sizeof(buf), fmt->s().c_str(), &tm);
          return Value::String(std::string(buf, len));
        }
        if (f == "dict") {
          Value::Dict d;
          for (const auto& [k, x] : args->kw) d.emplace_back(k, x);
          return Value::DictOf(std::move(d));
        }
      }
      return Error(n, absl::StrCat("'", f, "' is not callable"));
    }
    return Error(n, "this expression is not callable");
  }

  absl::StatusOr<Value> Range(const Node* n, const Args& a) {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& v : a.pos) {
      if (v.kind() != Value::Kind::kInt) return Error(n, "range() takes integers");
    }
    if (a.pos.size() == 1) {
      stop = a.pos[0].i();
    } else if (a.pos.size() >= 2) {
      start = a.pos[0].i();
      stop = a.pos[1].i();
      if (a.pos.size() == 3) step = a.pos[2].i();
    } else {
      return Error(n, "range() takes 1 to 3 integers");
    }
    if (step == 0) return Error(n, "range() step cannot be zero");
    Value::List l;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (static_cast<int64_t>(l.size()) >= limits_.max_loop_iterations) {
        return Error(n, "range() too large");
      }
      l.push_back(Value::Int(i));
    }
    return Value::ListOf(std::move(l));
  }

  absl::StatusOr<Value> CallMacro(const Node* n, const Value& m, const Args& a) {
    const Node* def = m.macro()->def;
    if (a.pos.size() > def->targets.size())
      return Error(n, absl::StrCat("too many arguments to ", def->name));
    if (++macro_depth_ > 50) {
      --macro_depth_;
      return Error(n, "macros nested too deeply");
    }
    Scope scope;
    for (size_t k = 0; k < def->targets.size(); ++k) {
      const Value* v = a.Get(k, def->targets[k]);
      if (v != nullptr) {
        scope[def->targets[k]] = *v;
      } else if (def->kids[k] != nullptr) {
        absl::StatusOr<Value> d = Eval(def->kids[k]);
        if (!d.ok()) {
          --macro_depth_;
          return d;
        }
        scope[def->targets[k]] = *d;
      }
    }
    // A macro sees the template's globals and its own arguments.
    std::vector<Scope> saved(scopes_.begin() + 1, scopes_.end());
    scopes_.resize(1);
    scopes_.push_back(std::move(scope));
    std::string out;
    Flow f;
    absl::Status s = Exec(def->body, &out, &f);
    scopes_.resize(1);
    scopes_.insert(scopes_.end(), saved.begin(), saved.end());
    --macro_depth_;
    if (!s.ok()) return s;
    return Value::String(out);
  }

  absl::StatusOr<Value> CallMethod(const Node* n, const Value& obj, const std::string& m,
                                   const Args& a) {
    auto arg = [&](size_t i, const char* name) { return a.Get(i, name); };
    if (obj.is_string()) {
      const std::string& s = obj.s();
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        const Value* chars = arg(0, "chars");
        if (chars != nullptr && !chars->is_string() && !chars->is_none())
          return Error(n, m + "() takes a string");
        return Value::String(PyStrip(s, chars, m != "rstrip", m != "lstrip"));
      }
      if (m == "startswith" || m == "endswith") {
        const Value* p = arg(0, "prefix");
        if (p == nullptr) return Error(n, m + "() takes an argument");
        std::vector<std::string> options;
        if (p->is_string()) {
          options.push_back(p->s());
        } else if (p->is_list()) {
          for (const Value& x : p->list()) {
            if (!x.is_string()) return Error(n, m + "() takes strings");
            options.push_back(x.s());
          }
        } else {
          return Error(n, m + "() takes a string or a tuple of strings");
        }
        for (const std::string& o : options) {
          const bool hit =
              m == "startswith"
                  ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
                  : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0;
          if (hit) return Value::Bool(true);
        }
        return Value::Bool(false);
      }
      if (m == "split" || m == "rsplit") {
        const Value* sep = arg(0, "sep");
        const Value* maxsplit = arg(1, "maxsplit");
        const int64_t max =
            maxsplit != nullptr && maxsplit->kind() == Value::Kind::kInt ? maxsplit->i() : -1;
        Value::List parts;
        if (sep == nullptr || sep->is_none()) {
          // whitespace runs; no empty parts
          std::vector<std::string> words;
          size_t k = 0;
          while (k < s.size()) {
            while (k < s.size() && SpaceAt(s, k) > 0) k += SpaceAt(s, k);
            if (k >= s.size()) break;
            if (max >= 0 && static_cast<int64_t>(words.size()) == max && m == "split") {
              words.push_back(PyStrip(s.substr(k), nullptr, false, true));
              k = s.size();
              break;
            }
            size_t e = k;
            while (e < s.size() && SpaceAt(s, e) == 0) ++e;
            words.push_back(s.substr(k, e - k));
            k = e;
          }
          for (std::string& w : words) parts.push_back(Value::String(std::move(w)));
          return Value::ListOf(std::move(parts));
        }
        if (!sep->is_string() || sep->s().empty())
          return Error(n, "split() takes a non-empty string");
        const std::string& d = sep->s();
        std::vector<std::string> pieces;
        if (m == "split") {
          size_t k = 0;
          while (true) {
            const size_t f = s.find(d, k);
            if (f == std::string::npos ||
                (max >= 0 && static_cast<int64_t>(pieces.size()) == max)) {
              pieces.push_back(s.substr(k));
              break;
            }
            pieces.push_back(s.substr(k, f - k));
            k = f + d.size();
          }
        } else {
          size_t e = s.size();
          while (true) {
            const size_t f = e >= d.size() ? s.rfind(d, e - d.size()) : std::string::npos;
            if (f == std::string::npos ||
                (max >= 0 && static_cast<int64_t>(pieces.size()) == max)) {
              pieces.insert(pieces.begin(), s.substr(0, e));
              break;
            }
            pieces.insert(pieces.begin(), s.substr(f + d.size(), e - f - d.size()));
            e = f;
          }
        }
        for (std::string& p : pieces) parts.push_back(Value::String(std::move(p)));
        return Value::ListOf(std::move(parts));
      }
      if (m == "replace") {
        const Value* from = arg(0, "old");
        const Value* to = arg(1, "new");
        if (from == nullptr || to == nullptr || !from->is_string() || !to->is_string()) {
          return Error(n, "replace() takes two strings");
        }
        return Value::String(Replace(s, from->s(), to->s()));
      }
      if (m == "upper" || m == "lower") {
        std::string r = s;
        for (char& c : r)
          c = static_cast<char>(m == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                             : std::tolower(static_cast<unsigned char>(c)));
        return Value::String(r);
      }
      if (m == "title" || m == "capitalize") return Value::String(Titled(s, m == "title"));
      if (m == "find" || m == "count") {
        const Value* sub = arg(0, "sub");
        if (sub == nullptr || !sub->is_string()) return Error(n, m + "() takes a string");
        if (m == "find") {
          const size_t f = s.find(sub->s());
          return Value::Int(f == std::string::npos
                                ? -1
                                : static_cast<int64_t>(CodePoints(s.substr(0, f)).size()));
        }
        int64_t c = 0;
        if (sub->s().empty()) return Value::Int(static_cast<int64_t>(CodePoints(s).size()) + 1);
        for (size_t f = s.find(sub->s()); f != std::string::npos;
             f = s.find(sub->s(), f + sub->s().size()))
          ++c;
        return Value::Int(c);
      }
      if (m == "join") {
        const Value* items = arg(0, "iterable");
        if (items == nullptr) return Error(n, "join() takes an iterable");
        absl::StatusOr<Value::List> l = Iterate(n, *items);
        if (!l.ok()) return l.status();
        std::string r;
        for (size_t k = 0; k < l->size(); ++k) {
          if (!(*l)[k].is_string()) return Error(n, "join() takes strings");
          if (k > 0) r += s;
          r += (*l)[k].s();
        }
        return Value::String(r);
      }
      if (m == "isdigit" || m == "isspace" || m == "isalpha") {
        bool r = !s.empty();
        for (char c : s) {
          const unsigned char u = static_cast<unsigned char>(c);
          r = r && (m == "isdigit"   ? std::isdigit(u) != 0
                    : m == "isspace" ? IsSpace(c)
                                     : std::isalpha(u) != 0);
        }
        return Value::Bool(r);
      }
    }
    if (obj.is_dict()) {
      if (m == "get") {
        const Value* key = arg(0, "key");
        if (key == nullptr) return Error(n, "get() takes a key");
        const Value* v = key->is_string() ? obj.Find(key->s()) : nullptr;
        if (v != nullptr) return *v;
        const Value* def = arg(1, "default");
        return def != nullptr ? *def : Value::None();
      }
      if (m == "items" || m == "keys" || m == "values") {
        Value::List l;
        for (const auto& [k, v] : obj.dict()) {
          if (m == "items") {
            l.push_back(Value::ListOf({Value::String(k), v}));
          } else {
            l.push_back(m == "keys" ? Value::String(k) : v);
          }
        }
        return Value::ListOf(std::move(l));
      }
    }
    if (obj.is_list() && m == "index") {
      const Value* x = arg(0, "value");
      for (size_t k = 0; x != nullptr && k < obj.list().size(); ++k) {
        if (Equal(obj.list()[k], *x)) return Value::Int(static_cast<int64_t>(k));
      }
      return Error(n, "index(): value not in list");
    }
    if (obj.is_list() && (m == "append" || m == "pop" || m == "extend" || m == "insert")) {
      return Error(n, absl::StrCat("list.", m, "() modifies a list, which the sandbox forbids"));
    }
    if (obj.is_undefined())
      return Error(n, absl::StrCat("undefined value has no method ", m, "()"));
    return Error(n, absl::StrCat("unknown method ", m, "() of ", obj.Repr()));
  }

  static std::string Replace(const std::string& s, const std::string& from, const std::string& to) {
    if (from.empty()) {
      std::string r = to;
      for (const std::string& cp : CodePoints(s)) r += cp + to;
      return r;
    }
    std::string r;
    size_t k = 0;
    for (size_t f = s.find(from); f != std::string::npos; f = s.find(from, k)) {
      r += s.substr(k, f - k) + to;
      k = f + from.size();
    }
    return r + s.substr(k);
  }

  static std::string Titled(const std::string& s, bool every_word) {
    std::string r = s;
    bool start = true;
    for (size_t k = 0; k < r.size(); ++k) {
      const unsigned char c = static_cast<unsigned char>(r[k]);
      if (std::isalpha(c)) {
        r[k] = static_cast<char>(start ? std::toupper(c) : std::tolower(c));
        start = false;
      } else if (every_word) {
        start = !(c & 0x80) && !std::isdigit(c) && c != '\'';
        if (std::isdigit(c) || c == '\'') start = false;
      } else {
        start = false;
      }
    }
    return r;
  }

  absl::StatusOr<Value> EvalFilter(const Node* n) {
    absl::StatusOr<Value> pv = Eval(n->kids[0]);
    if (!pv.ok()) return pv;
    const Value& v = *pv;
    absl::StatusOr<Args> pa = EvalArgs(n, 1);
    if (!pa.ok()) return pa.status();
    const Args& a = *pa;
    const std::string& f = n->name;
    if (f == "trim") {
      const Value* chars = a.Get(0, "chars");
      return Value::String(PyStrip(v.Str(), chars, true, true));
    }
    if (f == "length" || f == "count") {
      if (v.is_string()) return Value::Int(static_cast<int64_t>(CodePoints(v.s()).size()));
      if (v.is_list()) return Value::Int(static_cast<int64_t>(v.list().size()));
      if (v.is_dict()) return Value::Int(static_cast<int64_t>(v.dict().size()));
      if (v.is_undefined()) return Value::Int(0);
      return Error(n, absl::StrCat("object of type ", v.Repr(), " has no length"));
    }
    if (f == "tojson") {
      const Value* indent = a.Get(0, "indent");
      return Value::String(v.Json(indent != nullptr && indent->kind() == Value::Kind::kInt
                                      ? static_cast<int>(indent->i())
                                      : -1));
    }
    if (f == "string") return Value::String(v.Str());
    if (f == "safe" || f == "e" || f == "escape") {
      if (f == "safe") return v;
      return Error(n, "the escape filter is not supported (chat templates do not autoescape)");
    }
    if (f == "upper" || f == "lower" || f == "title" || f == "capitalize") {
      return CallMethod(n, Value::String(v.Str()), f, Args());
    }
    if (f == "replace") return CallMethod(n, Value::String(v.Str()), "replace", a);
    if (f == "default" || f == "d") {
      const Value* def = a.Get(0, "default_value");
      const Value* boolean = a.Get(1, "boolean");
      const bool use = v.is_undefined() || (boolean != nullptr && boolean->Truthy() && !v.Truthy());
      if (!use) return v;
      return def != nullptr ? *def : Value::String("");
    }
    if (f == "int") {
      if (v.kind() == Value::Kind::kInt) return v;
      if (v.kind() == Value::Kind::kFloat) return Value::Int(static_cast<int64_t>(v.f()));
      if (v.kind() == Value::Kind::kBool) return Value::Int(v.b());
      if (v.is_string()) {
        char* end = nullptr;
        const long long x = std::strtoll(v.s().c_str(), &end, 10);
        return Value::Int(end != nullptr && *end == '\0' && !v.s().empty() ? x : 0);
      }
      return Value::Int(0);
    }
    if (f == "float") {
      if (v.is_number()) return Value::Float(v.f());
      if (v.is_string()) return Value::Float(std::strtod(v.s().c_str(), nullptr));
      return Value::Float(0);
    }
    if (f == "abs") {
      if (v.kind() == Value::Kind::kInt) return Value::Int(v.i() < 0 ? -v.i() : v.i());
      if (v.is_number()) return Value::Float(std::fabs(v.f()));
      return Error(n, "abs of a non-number");
    }
    if (f == "list" || f == "first" || f == "last" || f == "reverse" || f == "join" ||
        f == "unique" || f == "sort" || f == "selectattr" || f == "rejectattr" || f == "map" ||
        f == "select" || f == "reject" || f == "sum" || f == "min" || f == "max") {
      absl::StatusOr<Value::List> pl = Iterate(n, v);
      if (!pl.ok()) return pl.status();
      Value::List l = std::move(*pl);
      if (f == "list") return Value::ListOf(std::move(l));
      if (f == "first") return l.empty() ? Value() : l.front();
      if (f == "last") return l.empty() ? Value() : l.back();
      if (f == "reverse") {
        if (v.is_string()) {
          std::string r;
          for (auto it = l.rbegin(); it != l.rend(); ++it) r += it->s();
          return Value::String(r);
        }
        std::reverse(l.begin(), l.end());
        return Value::ListOf(std::move(l));
      }
      if (f == "join") {
        const Value* sep = a.Get(0, "d");
        const Value* attr = a.Get(1, "attribute");
        std::string r;
        for (size_t k = 0; k < l.size(); ++k) {
          if (k > 0 && sep != nullptr) r += sep->Str();
          r += attr != nullptr && l[k].is_dict() && l[k].Find(attr->Str()) != nullptr
                   ? l[k].Find(attr->Str())->Str()
                   : l[k].Str();
        }
        return Value::String(r);
      }
      if (f == "unique") {
        Value::List u;
        for (const Value& x : l) {
          if (std::none_of(u.begin(), u.end(), [&](const Value& y) { return Equal(x, y); }))
            u.push_back(x);
        }
        return Value::ListOf(std::move(u));
      }
      if (f == "sort") {
        const Value* rev = a.Get(0, "reverse");
        const Value* attr = a.Get(2, "attribute");
        absl::Status err;
        auto key = [&](const Value& x) {
          if (attr != nullptr && x.is_dict() && x.Find(attr->Str()) != nullptr)
            return *x.Find(attr->Str());
          return x;
        };
        std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
          absl::StatusOr<int> c = Order(n, key(x), key(y));
          if (!c.ok()) {
            err = c.status();
            return false;
          }
          return *c < 0;
        });
        if (!err.ok()) return err;
        if (rev != nullptr && rev->Truthy()) std::reverse(l.begin(), l.end());
        return Value::ListOf(std::move(l));
      }
      if (f == "sum" || f == "min" || f == "max") {
        if (l.empty()) return f == "sum" ? Value::Int(0) : Value();
        Value acc = l[0];
        for (size_t k = 1; k < l.size(); ++k) {
          if (f == "sum") {
            if (!acc.is_number() || !l[k].is_number()) return Error(n, "sum of non-numbers");
            acc = acc.kind() == Value::Kind::kInt && l[k].kind() == Value::Kind::kInt
                      ? Value::Int(acc.i() + l[k].i())
                      : Value::Float(acc.f() + l[k].f());
          } else {
            absl::StatusOr<int> c = Order(n, l[k], acc);
            if (!c.ok()) return c.status();
            if ((f == "min" && *c < 0) || (f == "max" && *c > 0)) acc = l[k];
          }
        }
        return acc;
      }
      if (f == "map") {
        const Value* attr = a.Get(99, "attribute");
        Value::List out;
        if (attr != nullptr) {
          for (const Value& x : l) {
            absl::StatusOr<Value> y = GetAttr(n, x, attr->Str());
            if (!y.ok()) return y;
            out.push_back(y->is_undefined() && a.kw.count("default") ? a.kw.at("default") : *y);
          }
          return Value::ListOf(std::move(out));
        }
        if (a.pos.empty() || !a.pos[0].is_string())
          return Error(n, "map() takes a filter name or attribute=");
        Node call = *n;
        call.name = a.pos[0].s();
        for (const Value& x : l) {
          Node lit;
          lit.type = N::kLiteral;
          lit.literal = x;
          lit.line = n->line;
          call.kids = {&lit};
          call.kw_names.clear();
          absl::StatusOr<Value> y = EvalFilter(&call);
          if (!y.ok()) return y;
          out.push_back(*y);
        }
        return Value::ListOf(std::move(out));
      }
      // select / reject / selectattr / rejectattr
      const bool by_attr = f == "selectattr" || f == "rejectattr";
      const bool keep_if = f == "select" || f == "selectattr";
      size_t k0 = 0;
      std::string attr;
      if (by_attr) {
        if (a.pos.empty()) return Error(n, f + "() takes an attribute name");
        attr = a.pos[0].Str();
        k0 = 1;
      }
      Value::List out;
      for (const Value& x : l) {
        Value item = x;
        if (by_attr) {
          absl::StatusOr<Value> y = GetAttr(n, x, attr);
          if (!y.ok()) return y;
          item = *y;
        }
        bool pass = item.Truthy();
        if (a.pos.size() > k0) {
          absl::StatusOr<bool> t =
              ApplyTest(n, a.pos[k0].Str(), item,
                        std::vector<Value>(a.pos.begin() + static_cast<long>(k0) + 1, a.pos.end()));
          if (!t.ok()) return t.status();
          pass = *t;
        }
        if (pass == keep_if) out.push_back(x);
      }
      return Value::ListOf(std::move(out));
    }
    if (f == "items") return CallMethod(n, v, "items", Args());
    if (f == "dictsort") {
      if (!v.is_dict()) return Error(n, "dictsort of a non-dict");
      Value::Dict d = v.dict();
      std::stable_sort(d.begin(), d.end(),
                       [](const auto& x, const auto& y) { return x.first < y.first; });
      Value::List l;
      for (auto& [k, x] : d) l.push_back(Value::ListOf({Value::String(k), x}));
      return Value::ListOf(std::move(l));
    }
    if (f == "indent") {
      const Value* width = a.Get(0, "width");
      const Value* first = a.Get(1, "first");
      const std::string pad(width != nullptr && width->kind() == Value::Kind::kInt
                                ? static_cast<size_t>(width->i())
                                : 4,
                            ' ');
      std::string s = v.Str(), r;
      bool line_start = first != nullptr && first->Truthy();
      for (char c : s) {
        if (line_start && c != '\n') r += pad;
        line_start = false;
        r += c;
        if (c == '\n') line_start = true;
      }
      return Value::String(r);
    }
    if (f == "round") {
      if (!v.is_number()) return Error(n, "round of a non-number");
      const Value* prec = a.Get(0, "precision");
      const double scale =
          std::pow(10.0, prec != nullptr && prec->kind() == Value::Kind::kInt ? prec->i() : 0);
      return Value::Float(std::nearbyint(v.f() * scale) / scale);
    }
    if (f == "wordcount")
      return Value::Int(static_cast<int64_t>(
          CallMethod(n, Value::String(v.Str()), "split", Args())->list().size()));
    return Error(n, absl::StrCat("unknown filter '", f, "'"));
  }

  absl::StatusOr<bool> EvalTest(const Node* n) {
    absl::StatusOr<Value> v = Eval(n->kids[0]);
    if (!v.ok()) return v.status();
    absl::StatusOr<std::vector<Value>> args = EvalAll(n->kids, 1);
    if (!args.ok()) return args.status();
    return ApplyTest(n, n->name, *v, *args);
  }

  absl::StatusOr<bool> ApplyTest(const Node* n, const std::string& t, const Value& v,
                                 const std::vector<Value>& args) {
    using K = Value::Kind;
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.is_none();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.kind() == K::kInt;
    if (t == "float") return v.kind() == K::kFloat;
    if (t == "boolean") return v.kind() == K::kBool;
    if (t == "true") return v.kind() == K::kBool && v.b();
    if (t == "false") return v.kind() == K::kBool && !v.b();
    if (t == "mapping") return v.is_dict();
    if (t == "sequence") return v.is_list() || v.is_string() || v.is_dict();
    if (t == "iterable") return v.is_list() || v.is_string() || v.is_dict();
    if (t == "callable") return v.kind() == K::kMacro;
    if (t == "lower" || t == "upper") {
      if (!v.is_string()) return false;
      bool cased = false;
      for (char c : v.s()) {
        const unsigned char u = static_cast<unsigned char>(c);
        if (std::isalpha(u)) {
          cased = true;
          if (t == "lower" ? std::isupper(u) : std::islower(u)) return false;
        }
      }
      return cased;
    }
    if (t == "even" || t == "odd") {
      if (v.kind() != K::kInt) return Error(n, t + " test of a non-integer");
      return (v.i() % 2 == 0) == (t == "even");
    }
    if (args.empty())
      return Error(n, absl::StrCat("unknown test '", t, "' (or it needs an argument)"));
    const Value& x = args[0];
    if (t == "eq" || t == "equalto" || t == "==") return Equal(v, x);
    if (t == "ne" || t == "!=") return !Equal(v, x);
    if (t == "sameas") return Equal(v, x) && v.kind() == x.kind();
    if (t == "in") return Contains(n, v, x);
    if (t == "divisibleby") {
      if (v.kind() != K::kInt || x.kind() != K::kInt || x.i() == 0)
        return Error(n, "divisibleby takes integers");
      return v.i() % x.i() == 0;
    }
    if (t == "lt" || t == "gt" || t == "le" || t == "ge" || t == "lessthan" || t == "greaterthan") {
      absl::StatusOr<int> c = Order(n, v, x);
      if (!c.ok()) return c.status();
      return t == "lt" || t == "lessthan"      ? *c < 0
             : t == "gt" || t == "greaterthan" ? *c > 0
             : t == "le"                       ? *c <= 0
                                               : *c >= 0;
    }
    return Error(n, absl::StrCat("unknown test '", t, "'"));
  }

  const Limits& limits_;
  std::vector<Scope> scopes_;
  int depth_ = 0;
  int macro_depth_ = 0;
  int64_t iterations_ = 0;
};

}  // namespace

absl::StatusOr<std::string> Template::Render(const std::map<std::string, Value>& vars) const {
  Renderer r(limits_, vars);
  std::string out;
  if (absl::Status s = r.Run(body_, &out); !s.ok()) return s;
  return out;
}

}  // namespace loom::jinja
