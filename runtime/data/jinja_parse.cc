// The lexer (trim_blocks and lstrip_blocks as jinja2's lexer applies them)
// and the parser (jinja2's grammar and precedence) of runtime/data/jinja.h.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/data/jinja.h"
#include "runtime/data/jinja_syntax.h"

namespace loom::jinja {

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

}  // namespace loom::jinja
