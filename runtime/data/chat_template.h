// Chat templates: a conversation (system, user and assistant messages with
// "<image>" markers) rendered into the text a model trains on, with the
// byte ranges that carry loss.
//
// The template is the model's own (its tokenizer's chat_template, rendered
// by runtime/data/jinja.h as transformers renders it) or one of Loom's named
// templates:
//   plain      LLaVA stage 1: <s>, the user messages' image markers only
//              (their text dropped, as LLaVA's plain format drops it), each
//              assistant message and </s> after it. LLaVA ends the caption
//              with "\n"; Loom with </s>, so the caption's end is a token
//              the model learns to emit.
//   vicuna_v1  LLaVA-1.5's conversation: "<s>SYSTEM USER: q ASSISTANT: a</s>
//              USER: ..." with LLaVA's default system prompt.
//   chatml     "<|im_start|>role\ncontent<|im_end|>\n" (Qwen's turns).
//   llama3     Llama 3's template (header ids, trimmed content, <|eot_id|>).
// A job chooses with data.chat_template: "" (the tokenizer's own template,
// else vicuna_v1), a name above, or a file holding a Jinja template (or a
// chat_template.json / tokenizer_config.json holding one).
//
// Loss: the bytes of each assistant message's content, plus the special
// token the template puts right after it (the end of its turn: </s>,
// <|eot_id|>, <|im_end|>). They are found by rendering the conversation
// again with each assistant content between two marker code points
// (noncharacters that never occur in text): with the markers removed, that
// rendering must equal the plain one byte for byte. The markers go around
// the whole content first; where that changes the text (a template that
// trims its messages), inside the content's outer whitespace. If neither
// holds, the template is refused for this conversation (it rewrites
// assistant text in a way no span can follow) rather than guessed at.
#ifndef LOOM_RUNTIME_DATA_CHAT_TEMPLATE_H_
#define LOOM_RUNTIME_DATA_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/jinja.h"
#include "runtime/data/tokenizer.h"

namespace loom::data {

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

struct RenderedChat {
  std::string text;
  std::vector<Tokenizer::Span> loss;  // byte ranges of `text`, in order
};

// The named templates, in the order above.
const std::vector<std::string>& ChatTemplateNames();

class ChatTemplate {
 public:
  // Resolves a job's choice for `tokenizer` (not owned; must outlive this).
  static absl::StatusOr<std::shared_ptr<const ChatTemplate>> Resolve(std::string_view choice,
                                                                     const Tokenizer* tokenizer);
  // From a template's source; `name` names it in errors.
  static absl::StatusOr<std::shared_ptr<const ChatTemplate>> FromSource(std::string name,
                                                                        std::string_view source,
                                                                        const Tokenizer* tokenizer);

  // What was chosen: a template name, "tokenizer" or the file's path.
  const std::string& name() const { return name_; }
  // The template's Jinja text.
  const std::string& source() const { return source_; }

  // The text and its loss spans. INVALID_ARGUMENT for a conversation that
  // is not one (an unknown role, no messages, marker code points in it), a
  // template error (its raise_exception, e.g. roles that do not alternate)
  // or a template whose loss spans cannot be placed. Thread-safe.
  absl::StatusOr<RenderedChat> Render(const std::vector<ChatMessage>& messages) const;
  // The template's text alone, with the generation prompt when asked (the
  // prompt for loom-model generate).
  absl::StatusOr<std::string> RenderText(const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) const;

 private:
  ChatTemplate() = default;
  absl::StatusOr<std::string> RenderWith(const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) const;
  std::string name_;
  std::string source_;
  std::unique_ptr<jinja::Template> template_;
  const Tokenizer* tokenizer_ = nullptr;
};

}  // namespace loom::data

#endif  // LOOM_RUNTIME_DATA_CHAT_TEMPLATE_H_
