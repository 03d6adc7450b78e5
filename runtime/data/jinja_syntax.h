// What jinja_parse.cc and jinja_eval.cc share: the syntax tree. Private
// to runtime/data:jinja (jinja.h is the interface).
#ifndef LOOM_RUNTIME_DATA_JINJA_SYNTAX_H_
#define LOOM_RUNTIME_DATA_JINJA_SYNTAX_H_

#include <string>
#include <utility>
#include <vector>

#include "runtime/data/jinja.h"

namespace loom::jinja {

// ASCII whitespace (the lexer's, and str.isspace() on ASCII).
inline bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

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

}  // namespace loom::jinja

#endif  // LOOM_RUNTIME_DATA_JINJA_SYNTAX_H_
