#include "runtime/data/chat_template.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"
#include "runtime/data/data_testing.h"
#include "runtime/data/jinja.h"
#include "runtime/data/preprocess.h"

namespace loom::data {
namespace {

const Tokenizer& Tok() { return testing::TestTokenizer(); }

std::shared_ptr<const ChatTemplate> Named(const std::string& name) {
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = ChatTemplate::Resolve(name, &Tok());
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : nullptr;
}

// The text of each loss span.
std::vector<std::string> Spans(const RenderedChat& r) {
  std::vector<std::string> out;
  for (const Tokenizer::Span& s : r.loss) out.push_back(r.text.substr(s.begin, s.end - s.begin));
  return out;
}

const std::vector<ChatMessage> kTwoTurns = {
    {"user", "<image>\nwhat is in the picture?"},
    {"assistant", "two red circles."},
    {"user", "where?"},
    {"assistant", " in the top left. "},
};

TEST(ChatTemplateTest, VicunaV1IsLlavaOnePointFivesConversation) {
  absl::StatusOr<RenderedChat> r = Named("vicuna_v1")->Render(kTwoTurns);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text,
            "<s>A chat between a curious human and an artificial intelligence assistant. The "
            "assistant gives helpful, detailed, and polite answers to the human's questions. "
            "USER: <image>\nwhat is in the picture? ASSISTANT: two red circles.</s>USER: where? "
            "ASSISTANT:  in the top left. </s>");
  // The answers and the </s> after each; the spaces around the second
  // answer are its own text, so they carry loss too.
  EXPECT_EQ(Spans(*r),
            (std::vector<std::string>{"two red circles.</s>", " in the top left. </s>"}));
  absl::StatusOr<std::string> prompt = Named("vicuna_v1")->RenderText({kTwoTurns[0]}, true);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_TRUE(absl::EndsWith(*prompt, "USER: <image>\nwhat is in the picture? ASSISTANT:"))
      << *prompt;
}

TEST(ChatTemplateTest, PlainKeepsTheImageAndTheCaptionOnly) {
  absl::StatusOr<RenderedChat> r = Named("plain")->Render(
      {{"user", "<image>\nDescribe this briefly."}, {"assistant", "A cat."}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "<s><image>A cat.</s>");
  EXPECT_EQ(Spans(*r), (std::vector<std::string>{"A cat.</s>"}));
}

TEST(ChatTemplateTest, ChatmlAndLlama3) {
  absl::StatusOr<RenderedChat> r =
      Named("chatml")->Render({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n");
  // Loom's own tokenizer has no <|im_end|> token: only the answer.
  EXPECT_EQ(Spans(*r), (std::vector<std::string>{"Hello!"}));
  // llama3 trims each message: the span follows the trimmed answer.
  r = Named("llama3")->Render({{"user", " Hi "}, {"assistant", "\n Hello! \n"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text,
            "<s><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>"
            "assistant<|end_header_id|>\n\nHello!<|eot_id|>");
  EXPECT_EQ(Spans(*r), (std::vector<std::string>{"Hello!"}));
}

TEST(ChatTemplateTest, RefusesWhatItCannotFollow) {
  auto error = [](const std::string& source, const std::vector<ChatMessage>& m) {
    absl::StatusOr<std::shared_ptr<const ChatTemplate>> t =
        ChatTemplate::FromSource("test", source, &Tok());
    if (!t.ok()) return std::string(t.status().message());
    absl::StatusOr<RenderedChat> r = (*t)->Render(m);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  const std::string each = "{% for m in messages %}{{ m.content }}{% endfor %}";
  EXPECT_EQ(error(each, {{"user", "a"}, {"assistant", "b"}}), "ok");
  {
    const std::string e = error(each, {{"robot", "a"}});
    EXPECT_NE(e.find("role \"robot\""), std::string::npos) << e;
  }
  // A filter that treats the markers as text keeps the spans.
  EXPECT_EQ(error("{{ messages[0].content|upper }}{{ messages[1].content|upper }}",
                  {{"user", "a"}, {"assistant", "b"}}),
            "ok");
  EXPECT_NE(error("{% if messages[1].content == 'b' %}yes{% endif %}",
                  {{"user", "a"}, {"assistant", "b"}})
                .find("changes the text of assistant messages"),
            std::string::npos);
  EXPECT_NE(error("{% for m in messages %}{{ m.content[1:] }}{% endfor %}",
                  {{"user", "a"}, {"assistant", "bc"}})
                .find("loss spans"),
            std::string::npos);
  EXPECT_NE(error("{{ raise_exception('Conversation roles must alternate') }}", {{"user", "a"}})
                .find("Conversation roles must alternate"),
            std::string::npos);
  EXPECT_NE(error("{% for %}", {{"user", "a"}}).find("template line 1"), std::string::npos);
  EXPECT_NE(error(each, {{"assistant", "x\xEF\xB7\x90"}}).find("U+FDD0"), std::string::npos);
  EXPECT_NE(error(each, {}).find("needs a message"), std::string::npos);
}

TEST(ChatTemplateTest, ChoiceIsANameAFileOrTheDefault) {
  // Loom's tokenizer has no template of its own: the default is vicuna_v1.
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = ChatTemplate::Resolve("", &Tok());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->name(), "vicuna_v1");
  const std::string dir = loom::testing::TempPath("chat_choice");
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(
      WriteFileAtomically(dir + "/t.jinja", "{% for m in messages %}[{{ m.content }}]{% endfor %}")
          .ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/chat_template.json",
                                  R"({"chat_template": "{{ messages|length }}"})")
                  .ok());
  t = ChatTemplate::Resolve(dir + "/t.jinja", &Tok());
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<RenderedChat> r = (*t)->Render({{"user", "q"}, {"assistant", "a"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "[q][a]");
  t = ChatTemplate::Resolve(dir + "/chat_template.json", &Tok());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->RenderText({{"user", "q"}}, false), "1");
  t = ChatTemplate::Resolve("vicuna", &Tok());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("plain, vicuna_v1, chatml, llama3"), std::string::npos)
      << t.status();
}

TEST(ChatTemplateTest, EncodeMarkedPlacesTheAnswersTokens) {
  absl::StatusOr<RenderedChat> r = Named("vicuna_v1")->Render(kTwoTurns);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> ids;
  std::vector<uint8_t> marks;
  ASSERT_TRUE(Tok().EncodeMarked(r->text, r->loss, &ids, &marks).ok());
  ASSERT_EQ(ids.size(), marks.size());
  EXPECT_EQ(ids.front(), Tok().bos_id()) << "the template's <s> is the bos id";
  // The marked ids are the two answers, each ending in </s>.
  std::vector<std::vector<int32_t>> runs;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (marks[i] == 0) continue;
    if (i == 0 || marks[i - 1] == 0) runs.emplace_back();
    runs.back().push_back(ids[i]);
  }
  ASSERT_EQ(runs.size(), 2u);
  for (auto& run : runs) {
    EXPECT_EQ(run.back(), Tok().eos_id());
    run.pop_back();
  }
  EXPECT_EQ(Tok().Decode(runs[0]), "two red circles.");
  EXPECT_EQ(Tok().Decode(runs[1]), "in the top left.");
}

TEST(ChatTemplateTest, PreprocessTrainsOnTheAnswersOnly) {
  PreprocessOptions o = PreprocessOptionsFor(*ModelConfigByName("tiny"));
  o.chat = Named("vicuna_v1");
  Preprocessor p(o, &Tok());
  SampleFiles f;
  f.key = "conv.1";
  f.files["json"] = R"({"messages": [{"role": "user", "content": "<image>\nWhat is it?"},)"
                    R"( {"role": "assistant", "content": "a red square."}], "images": ["0.png"]})";
  f.files["0.png"] = testing::TestPng(40, 40);
  Outcome out = p.Process(f);
  ASSERT_TRUE(out.ok) << out.skip.reason << ": " << out.skip.detail;
  const Sample& s = out.sample.sample;
  ASSERT_EQ(s.loss_mask.size(), s.tokens.size());
  int slots = 0, marked = 0;
  std::vector<int32_t> answer;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    if (s.tokens[i] < 0) {
      ++slots;
      EXPECT_EQ(s.loss_mask[i], 0) << "an image slot carries no loss";
    }
    if (s.loss_mask[i] != 0) {
      ++marked;
      answer.push_back(s.tokens[i]);
    }
  }
  EXPECT_EQ(slots, out.sample.image_tokens);
  ASSERT_FALSE(answer.empty());
  EXPECT_EQ(answer.back(), Tok().eos_id());
  answer.pop_back();
  EXPECT_EQ(Tok().Decode(answer), "a red square.");
  EXPECT_EQ(out.sample.loss_tokens, marked);
  EXPECT_EQ(LossTokens(s), marked);
  // The packed targets are the answer's ids, -1 elsewhere.
  const LlmBatch b = PackSamples({&s});
  int targets = 0;
  for (size_t i = 0; i + 1 < s.tokens.size(); ++i) {
    EXPECT_EQ(b.targets[i], s.loss_mask[i + 1] ? s.tokens[i + 1] : -1) << i;
    targets += b.targets[i] >= 0;
  }
  EXPECT_EQ(targets, marked);

  // Refused, with a reason: text and messages both; no answer; no template.
  f.files["json"] =
      R"({"text": "<image> x", "messages": [{"role": "user", "content": "<image>"}], "images": ["0.png"]})";
  EXPECT_EQ(p.Process(f).skip.reason, "bad_conversation");
  f.files["json"] =
      R"({"messages": [{"role": "user", "content": "<image> hi"}], "images": ["0.png"]})";
  out = p.Process(f);
  EXPECT_EQ(out.skip.reason, "bad_conversation");
  EXPECT_NE(out.skip.detail.find("no assistant message"), std::string::npos) << out.skip.detail;
  f.files["json"] =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<image>"}], "images": []})";
  EXPECT_EQ(p.Process(f).skip.reason, "image_count_mismatch");
  // Without a template chosen: the tokenizer's own, else vicuna_v1.
  o.chat = nullptr;
  Preprocessor fallback(o, &Tok());
  f.files["json"] =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";
  out = fallback.Process(f);
  ASSERT_TRUE(out.ok) << out.skip.reason << ": " << out.skip.detail;
  EXPECT_GT(out.sample.loss_tokens, 0);
}

TEST(JinjaTest, RenderingIsBounded) {
  auto render = [](const std::string& source, jinja::Limits limits = {}) {
    absl::StatusOr<std::unique_ptr<jinja::Template>> t = jinja::Template::Parse(source, limits);
    if (!t.ok()) return t.status();
    return (*t)->Render({}).status();
  };
  jinja::Limits small;
  small.max_output_bytes = 1000;
  small.max_loop_iterations = 100;
  EXPECT_FALSE(render("{% for i in range(1000) %}x{% endfor %}", small).ok());
  EXPECT_FALSE(render("{{ 'x' * 100000 }}", small).ok());
  EXPECT_FALSE(
      render("{% for i in range(50) %}{% for j in range(50) %}{% endfor %}{% endfor %}", small)
          .ok());
  std::string deep;
  for (int i = 0; i < 500; ++i) deep += "(";
  EXPECT_FALSE(render("{{ " + deep + "1" + std::string(500, ')') + " }}").ok());
  EXPECT_EQ(render("{{ raise_exception('no') }}").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(render("{% for i in range(10) %}x{% endfor %}", small).ok());
}

}  // namespace
}  // namespace loom::data
