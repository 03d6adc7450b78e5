// A Jinja2 interpreter for chat templates: the subset of the language that
// Hugging Face chat templates use, rendered as transformers renders them
// (jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks
// and the loopcontrols extension; python3-jinja2 is the reference, checked
// by chat_template_reference_test).
//
// Statements: {{ }}, {% if/elif/else %}, {% for a[, b] in x [if c] %} with
// {% else %}, loop.* and {% break %}/{% continue %}, {% set x = e %},
// {% set ns.attr = e %}, {% set x %}...{% endset %}, {% macro %} with
// defaults and calls, {% generation %} (transparent), {# #}, and whitespace
// control (-, +). Expressions: literals (strings, numbers, lists, dicts,
// tuples), and/or/not, comparisons, in / not in, is [not] TEST, + - * / //
// % ~, a if c else b, attributes, subscripts, slices, calls, filters.
// Python's str, list and dict methods that templates call (strip, split,
// startswith, items, get, ...), the filters and tests they use
// (trim, tojson, length, default, join, selectattr, ...), and the globals
// namespace(), range(), raise_exception() and strftime_now().
//
// Values have Python's semantics where templates can see them: printing
// (True, None, 1.0, ['a']), truthiness, equality, string lengths and slices
// in code points, an undefined value that prints as "" and is falsy but
// fails when its attributes are read. Anything else is an error naming the
// template line, never a guess: an unknown filter, test or method, a type
// error, a template's raise_exception. Rendering is bounded (output size,
// loop iterations, nesting) so no template can hang or exhaust a service.
#ifndef LOOM_RUNTIME_DATA_JINJA_H_
#define LOOM_RUNTIME_DATA_JINJA_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::jinja {

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kMacro };
  using List = std::vector<Value>;
  // Insertion-ordered, as Python's dict.
  using Dict = std::vector<std::pair<std::string, Value>>;

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value ListOf(List items);
  static Value TupleOf(List items);  // a list that prints as a tuple
  static Value DictOf(Dict items);
  // A namespace() object: a dict whose attributes `set ns.x` may assign.
  static Value Namespace(Dict items);
  // From JSON text (objects keep their order); error on malformed JSON.
  static absl::StatusOr<Value> FromJson(std::string_view json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_namespace() const { return kind_ == Kind::kDict && ns_; }

  bool b() const { return b_; }
  int64_t i() const { return i_; }
  double f() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : f_; }
  const std::string& s() const { return *s_; }
  const List& list() const { return *list_; }
  List& mutable_list() { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_dict() { return *dict_; }
  // The entry `key` of a dict, or null.
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value v);  // dicts: replace or append

  bool Truthy() const;
  // str(x) as Python prints it (what {{ x }} writes).
  std::string Str() const;
  // repr(x): strings quoted as Python quotes them.
  std::string Repr() const;
  // json.dumps(x, ensure_ascii=False, indent=indent) (indent < 0: none).
  std::string Json(int indent = -1) const;

  struct Macro;
  std::shared_ptr<const Macro> macro() const { return macro_; }
  static Value MacroOf(std::shared_ptr<const Macro> m);

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool ns_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<List> list_;  // shared: Python's reference semantics
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Macro> macro_;
};

bool Equal(const Value& a, const Value& b);

struct Limits {
  int64_t max_output_bytes = 64LL << 20;
  int64_t max_loop_iterations = 1'000'000;  // all loops of one render together
  int max_depth = 200;                      // nesting of expressions and statements
};

class Template {
 public:
  // Parses `source`; INVALID_ARGUMENT naming the line of a syntax error.
  static absl::StatusOr<std::unique_ptr<Template>> Parse(std::string_view source,
                                                         Limits limits = {});
  ~Template();

  // Renders with the given variables. INVALID_ARGUMENT naming the line of an
  // error; a template's raise_exception(msg) is FAILED_PRECONDITION with msg.
  absl::StatusOr<std::string> Render(const std::map<std::string, Value>& vars) const;

  struct Node;

 private:
  Template();
  std::vector<Node*> body_;                   // owned by owned_
  std::vector<std::unique_ptr<Node>> owned_;  // expression arena
  Limits limits_;
  friend class Parser;
};

}  // namespace loom::jinja

#endif  // LOOM_RUNTIME_DATA_JINJA_H_
