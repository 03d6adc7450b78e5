// Rendering a parsed template (runtime/data/jinja.h): statements, Python's
// semantics for expressions, and the methods, filters and tests chat
// templates call.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/data/jinja.h"
#include "runtime/data/jinja_syntax.h"

namespace loom::jinja {

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
