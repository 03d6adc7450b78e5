#include "runtime/data/chat_template.h"

#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"

namespace loom::data {
namespace {

// The named templates (chat_template.h). Jinja, rendered like any model's.
const std::vector<std::pair<std::string, std::string>>& Named() {
  static const auto* named = new std::vector<std::pair<std::string, std::string>>{
      {"plain",
       "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}"
       "{{ '<image>' * m.content.count('<image>') }}"
       "{% elif m.role == 'assistant' %}{{ m.content + eos_token }}{% endif %}{% endfor %}"},
      {"vicuna_v1",
       "{{ bos_token }}{% if messages[0].role == 'system' %}{{ messages[0].content }}"
       "{% set start = 1 %}{% else %}A chat between a curious human and an artificial "
       "intelligence assistant. The assistant gives helpful, detailed, and polite answers to "
       "the human's questions.{% set start = 0 %}{% endif %}"
       "{% for m in messages[start:] %}{% if m.role == 'user' %}"
       "{{ (' ' if loop.first else '') + 'USER: ' + m.content + ' ' }}"
       "{% elif m.role == 'assistant' %}{{ 'ASSISTANT: ' + m.content + eos_token }}"
       "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"},
      {"chatml",
       "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + "
       "'<|im_end|>\\n' }}{% endfor %}"
       "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
      {"llama3",
       "{% for m in messages %}{% set content = '<|start_header_id|>' + m.role + "
       "'<|end_header_id|>\\n\\n' + m.content | trim + '<|eot_id|>' %}"
       "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
       "{{ content }}{% endfor %}"
       "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
       "{% endif %}"},
  };
  return *named;
}

// U+FDD0 and U+FDD1: noncharacters, never in text that means anything.
constexpr absl::string_view kBegin = "\xEF\xB7\x90";
constexpr absl::string_view kEnd = "\xEF\xB7\x91";

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

const std::vector<std::string>& ChatTemplateNames() {
  static const auto* names = [] {
    auto* n = new std::vector<std::string>();
    for (const auto& [name, source] : Named()) n->push_back(name);
    return n;
  }();
  return *names;
}

absl::StatusOr<std::shared_ptr<const ChatTemplate>> ChatTemplate::FromSource(
    std::string name, std::string_view source, const Tokenizer* tokenizer) {
  absl::StatusOr<std::unique_ptr<jinja::Template>> t = jinja::Template::Parse(source);
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template ", name, ": ", t.status().message()));
  }
  std::shared_ptr<ChatTemplate> c(new ChatTemplate());
  c->name_ = std::move(name);
  c->source_ = std::string(source);
  c->template_ = std::move(*t);
  c->tokenizer_ = tokenizer;
  return std::shared_ptr<const ChatTemplate>(std::move(c));
}

absl::StatusOr<std::shared_ptr<const ChatTemplate>> ChatTemplate::Resolve(
    std::string_view choice, const Tokenizer* tokenizer) {
  if (choice.empty()) {
    if (!tokenizer->chat_template().empty()) {
      return FromSource("tokenizer", tokenizer->chat_template(), tokenizer);
    }
    choice = "vicuna_v1";
  }
  for (const auto& [name, source] : Named()) {
    if (choice == name) return FromSource(name, source, tokenizer);
  }
  const std::string path(choice);
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template \"", path, "\" is neither a template name (",
                     absl::StrJoin(ChatTemplateNames(), ", "),
                     ") nor a readable file: ", text.status().message()));
  }
  if (absl::EndsWith(path, ".json")) {
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("chat_template") || !j["chat_template"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a JSON file holding a template needs a \"chat_template\" string"));
    }
    return FromSource(path, j["chat_template"].get<std::string>(), tokenizer);
  }
  return FromSource(path, *text, tokenizer);
}

absl::StatusOr<std::string> ChatTemplate::RenderWith(const std::vector<ChatMessage>& messages,
                                                     bool add_generation_prompt) const {
  jinja::Value::List list;
  for (const ChatMessage& m : messages) {
    list.push_back(jinja::Value::DictOf(
        {{"role", jinja::Value::String(m.role)}, {"content", jinja::Value::String(m.content)}}));
  }
  std::map<std::string, jinja::Value> vars = {
      {"messages", jinja::Value::ListOf(std::move(list))},
      {"add_generation_prompt", jinja::Value::Bool(add_generation_prompt)},
      {"tools", jinja::Value::None()},
      {"documents", jinja::Value::None()},
  };
  for (const auto& [key, token] : tokenizer_->special_tokens()) {
    vars[key] = jinja::Value::String(token);
  }
  absl::StatusOr<std::string> text = template_->Render(vars);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template ", name_, ": ", text.status().message()));
  }
  return text;
}

absl::StatusOr<std::string> ChatTemplate::RenderText(const std::vector<ChatMessage>& messages,
                                                     bool add_generation_prompt) const {
  if (messages.empty()) return absl::InvalidArgumentError("a conversation needs a message");
  return RenderWith(messages, add_generation_prompt);
}

namespace {

// The plain rendering with the markers taken out, and where they stood;
// nullopt when the markers did not come out in begin-end pairs.
std::optional<RenderedChat> Unmark(const std::string& marked) {
  RenderedChat out;
  out.text.reserve(marked.size());
  bool open = false;
  for (size_t k = 0; k < marked.size();) {
    const absl::string_view rest = absl::string_view(marked).substr(k);
    const bool begin = absl::StartsWith(rest, kBegin);
    if (begin || absl::StartsWith(rest, kEnd)) {
      if (begin == open) return std::nullopt;
      if (begin) {
        out.loss.push_back({out.text.size(), out.text.size()});
      } else {
        out.loss.back().end = out.text.size();
      }
      open = begin;
      k += kBegin.size();
      continue;
    }
    out.text += marked[k++];
  }
  if (open) return std::nullopt;
  return out;
}

}  // namespace

absl::StatusOr<RenderedChat> ChatTemplate::Render(const std::vector<ChatMessage>& messages) const {
  if (messages.empty()) return absl::InvalidArgumentError("a conversation needs a message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, ": role \"", m.role, "\" (system, user or assistant)"));
    }
    if (absl::StrContains(m.content, kBegin) || absl::StrContains(m.content, kEnd)) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, ": holds U+FDD0 or U+FDD1, noncharacters Loom reserves"));
    }
  }
  absl::StatusOr<std::string> plain = RenderWith(messages, false);
  if (!plain.ok()) return plain.status();
  // Markers around each whole answer (its spaces carry loss where the
  // template keeps them); where that changes the text (a template that
  // trims), markers inside the answer's outer whitespace.
  bool unplaceable = false;
  for (bool inside : {false, true}) {
    std::vector<ChatMessage> wrapped = messages;
    for (ChatMessage& m : wrapped) {
      if (m.role != "assistant") continue;
      const std::string c = m.content;
      size_t b = 0, e = c.size();
      if (inside) {
        while (b < e && IsAsciiSpace(c[b])) ++b;
        while (e > b && IsAsciiSpace(c[e - 1])) --e;
      }
      m.content = absl::StrCat(c.substr(0, b), kBegin, c.substr(b, e - b), kEnd, c.substr(e));
    }
    absl::StatusOr<std::string> marked = RenderWith(wrapped, false);
    if (!marked.ok()) return marked.status();
    std::optional<RenderedChat> out = Unmark(*marked);
    if (!out) {
      unplaceable = true;
      continue;
    }
    if (out->text != *plain) continue;
    // The end of each turn: the special token right after the answer.
    for (Tokenizer::Span& s : out->loss) s.end += tokenizer_->SpecialTokenAt(out->text, s.end);
    return *std::move(out);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "chat template ", name_,
      unplaceable ? ": splits or reorders assistant messages, so their loss spans cannot be placed"
                  : ": changes the text of assistant messages in a way their loss spans cannot "
                    "follow"));
}

}  // namespace loom::data
