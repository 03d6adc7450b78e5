#include "runtime/data/preprocess.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "loom/data/v1/sample.pb.h"

namespace loom::data {

PreprocessOptions PreprocessOptionsFor(const ModelConfig& config) {
  PreprocessOptions o;
  o.tile_size = config.vit.tile_size;
  o.tokens_per_tile = config.tokens_per_tile();
  o.max_seq = config.llm.max_seq;
  o.vit_tokens_per_tile = config.vit.patches_per_tile();
  if (config.has_generator()) {
    o.gen_image_size = config.generator.denoiser.tile_size;
    o.gen_queries = config.llm.gen_queries;
    o.gen_patches_per_image = config.generator.denoiser.patches_per_tile();
  }
  return o;
}

absl::Status CheckTokenizerFits(const Tokenizer& tokenizer, const ModelConfig& config) {
  if (tokenizer.vocab_size() > config.llm.vocab) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the tokenizer has ", tokenizer.vocab_size(), " pieces; model ", config.name,
        " has a vocabulary of ", config.llm.vocab, " (use the model's own tokenizer)"));
  }
  return absl::OkStatus();
}

TileGrid ChooseTileGrid(int width, int height, int max_tiles, int tile_size) {
  const double aspect = static_cast<double>(width) / height;
  TileGrid best;
  double best_diff = std::numeric_limits<double>::infinity();
  for (int n = 1; n <= std::max(1, max_tiles); ++n) {
    for (int cols = 1; cols <= n; ++cols) {
      if (n % cols != 0) continue;
      const int rows = n / cols;
      const double diff = std::abs(aspect - static_cast<double>(cols) / rows);
      if (diff < best_diff - 1e-12) {
        best = {cols, rows};
        best_diff = diff;
      } else if (std::abs(diff - best_diff) <= 1e-12 &&
                 static_cast<double>(width) * height >
                     0.5 * tile_size * tile_size * static_cast<double>(cols) * rows) {
        best = {cols, rows};
      }
    }
  }
  return best;
}

int TileCount(const TileGrid& grid, bool thumbnail) {
  const int n = grid.cols * grid.rows;
  return n > 1 && thumbnail ? n + 1 : n;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

Preprocessor::Preprocessor(PreprocessOptions options, const Tokenizer* tokenizer)
    : options_(std::move(options)), tokenizer_(tokenizer) {
  if (options_.chat == nullptr) {
    absl::StatusOr<std::shared_ptr<const ChatTemplate>> chat = ChatTemplate::Resolve("", tokenizer);
    if (chat.ok()) options_.chat = std::move(*chat);
  }
}

namespace {

const char* ImageErrorReason(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kResourceExhausted:
      return "image_too_large";
    case absl::StatusCode::kUnimplemented:
      return "unsupported_image";
    default:
      return "corrupt_image";
  }
}

// Appends the tiles of `image` (already decoded) for `grid`, normalised.
void AppendTiles(const Image& image, const TileGrid& grid, const PreprocessOptions& o,
                 std::vector<float>* out) {
  const int S = o.tile_size;
  auto emit = [&](const Image& src, int x0, int y0) {
    const size_t base = out->size();
    out->resize(base + 3 * static_cast<size_t>(S) * S);
    float* dst = out->data() + base;
    for (int c = 0; c < 3; ++c) {
      const float scale = 1.0f / (255.0f * o.std[c]), shift = o.mean[c] / o.std[c];
      for (int y = 0; y < S; ++y) {
        const uint8_t* row = &src.rgb[(static_cast<size_t>(y0 + y) * src.width + x0) * 3 + c];
        float* d = dst + (static_cast<size_t>(c) * S + y) * S;
        for (int x = 0; x < S; ++x) d[x] = row[x * 3] * scale - shift;
      }
    }
  };
  const Image resized = Resize(image, grid.cols * S, grid.rows * S);
  for (int r = 0; r < grid.rows; ++r) {
    for (int c = 0; c < grid.cols; ++c) emit(resized, c * S, r * S);
  }
  if (grid.cols * grid.rows > 1 && o.thumbnail) emit(Resize(image, S, S), 0, 0);
}

// The size `bytes`' header claims, within `limits`; the status's code gives
// the skip reason (ImageErrorReason).
absl::StatusOr<ImageInfo> PeekChecked(const std::string& bytes, const DecodeLimits& limits) {
  absl::StatusOr<ImageSize> size = PeekImageSize(bytes);
  if (!size.ok()) return size.status();
  if (absl::Status lim = CheckDecodeLimits(size->width, size->height, limits); !lim.ok()) {
    return lim;
  }
  ImageInfo info;
  info.width = size->width;
  info.height = size->height;
  info.tiles = 1;
  return info;
}

// Appends an output image: its largest centred square resized to S x S,
// (3, S, S) floats scaled to [-1, 1] (the generator's pixel space).
void AppendGenImage(const Image& image, int S, std::vector<float>* out) {
  const int side = std::min(image.width, image.height);
  Image square;
  square.width = square.height = side;
  square.rgb.resize(static_cast<size_t>(side) * side * 3);
  const int x0 = (image.width - side) / 2, y0 = (image.height - side) / 2;
  for (int y = 0; y < side; ++y) {
    const uint8_t* from = &image.rgb[(static_cast<size_t>(y0 + y) * image.width + x0) * 3];
    std::copy(from, from + static_cast<size_t>(side) * 3,
              &square.rgb[static_cast<size_t>(y) * side * 3]);
  }
  const Image resized = Resize(square, S, S);
  const size_t base = out->size();
  out->resize(base + 3 * static_cast<size_t>(S) * S);
  float* dst = out->data() + base;
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < S * S; ++i) dst[c * S * S + i] = resized.rgb[i * 3 + c] / 127.5f - 1.0f;
  }
}

}  // namespace

Outcome Preprocessor::Process(const SampleFiles& files, bool decode_pixels) const {
  Outcome out;
  out.skip.key = files.key;
  out.sample.key = files.key;
  auto skip = [&](std::string_view reason, std::string detail) {
    out.ok = false;
    out.skip.reason = std::string(reason);
    out.skip.detail = std::move(detail);
    out.sample = ProcessedSample();
    return out;
  };
  auto json = files.files.find("json");
  if (json == files.files.end()) return skip("missing_json", "no " + files.key + ".json");
  if (!IsValidUtf8(json->second)) return skip("invalid_utf8", files.key + ".json is not UTF-8");
  data::v1::SampleRecord record;
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = true;
  if (auto s = google::protobuf::util::JsonStringToMessage(json->second, &record, parse); !s.ok()) {
    return skip("bad_json", s.ToString());
  }
  // A conversation becomes its chat template's text, with loss spans.
  const bool chat = record.messages_size() > 0;
  RenderedChat rendered;
  if (chat) {
    if (!record.text().empty()) {
      return skip("bad_conversation", "a sample has text or messages, not both");
    }
    if (options_.chat == nullptr)
      return skip("bad_conversation",
                  "no chat template: the tokenizer's own does not parse (choose one with "
                  "data.chat_template)");
    std::vector<ChatMessage> messages;
    for (const data::v1::Message& m : record.messages())
      messages.push_back({m.role(), m.content()});
    absl::StatusOr<RenderedChat> r = options_.chat->Render(messages);
    if (!r.ok()) return skip("bad_conversation", std::string(r.status().message()));
    if (r->loss.empty()) {
      return skip("bad_conversation", "no assistant message: nothing to train on");
    }
    rendered = std::move(*r);
  }
  const std::string_view text = chat ? std::string_view(rendered.text) : record.text();
  std::vector<std::string_view> pieces;
  std::vector<size_t> piece_at;     // each piece's offset in `text`
  std::vector<bool> output_marker;  // each marker: an output image's, else an input image's
  std::vector<int> marker_image;    // each marker's image in its own list
  int inputs = 0, outputs = 0;
  {
    std::string_view rest = text;
    for (;;) {
      const size_t in = rest.find(kImageMarker), gen = rest.find(kOutputImageMarker);
      if (in == std::string_view::npos && gen == std::string_view::npos) break;
      const bool output = gen < in;
      const size_t at = output ? gen : in;
      piece_at.push_back(static_cast<size_t>(rest.data() - text.data()));
      pieces.push_back(rest.substr(0, at));
      output_marker.push_back(output);
      marker_image.push_back(output ? outputs++ : inputs++);
      rest.remove_prefix(at + (output ? kOutputImageMarker : kImageMarker).size());
    }
    piece_at.push_back(static_cast<size_t>(rest.data() - text.data()));
    pieces.push_back(rest);
  }
  const int markers = static_cast<int>(pieces.size()) - 1;
  bool has_text = false;
  for (std::string_view p : pieces) {
    has_text = has_text || p.find_first_not_of(" \t\r\n") != std::string_view::npos;
  }
  if (!has_text) return skip("empty_text", "no text besides image markers");
  if (inputs != record.images_size()) {
    return skip("image_count_mismatch",
                absl::StrCat(inputs, " <image> markers, ", record.images_size(), " images listed"));
  }
  if (outputs != record.output_images_size()) {
    return skip("image_count_mismatch",
                absl::StrCat(outputs, " <output_image> markers, ", record.output_images_size(),
                             " output images listed"));
  }
  if (outputs > 0 && options_.gen_image_size <= 0) {
    return skip("no_generator",
                absl::StrCat(outputs, " output images, and the model has no generator"));
  }
  std::vector<const std::string*> image_bytes, output_bytes;
  for (const bool output : {false, true}) {
    for (const std::string& ext : output ? record.output_images() : record.images()) {
      auto it = files.files.find(ext);
      if (it == files.files.end())
        return skip("missing_image", files.key + "." + ext + " not found");
      if (it->second.empty()) return skip("empty_image", files.key + "." + ext + " has 0 bytes");
      (output ? output_bytes : image_bytes).push_back(&it->second);
    }
  }

  // Text. A text too long to fit is refused before it is encoded, from its
  // bytes: one id stands for at most max_text_bytes_per_token of them, so
  // N bytes are at least ceil(N / that) ids (a piece at a time, whose sum is
  // at least the whole's). Encoding megabytes to refuse them would hold up
  // the in-order loader.
  std::vector<std::vector<int32_t>> piece_ids(pieces.size());
  std::vector<std::vector<uint8_t>> piece_marks(pieces.size());
  int text_tokens = chat ? 0 : tokenizer_->bos_id() >= 0 ? 2 : 1;
  if (const int64_t per_token = tokenizer_->max_text_bytes_per_token();
      per_token > 0 && options_.truncate) {
    // Truncating: only a prefix of the text can be kept, and its first
    // (max_seq + 16) x per_token bytes are at least that many ids; the rest
    // is not encoded (a piece cut there may encode its last word
    // differently, past the kept ids).
    const size_t budget = static_cast<size_t>(options_.max_seq + 16) * per_token;
    size_t bytes = 0;
    for (std::string_view& p : pieces) {
      if (bytes + p.size() > budget) {
        size_t keep = budget > bytes ? budget - bytes : 0;
        while (keep > 0 && keep < p.size() &&
               (static_cast<unsigned char>(p[keep]) & 0xC0) == 0x80) {
          --keep;
        }
        p = p.substr(0, keep);
      }
      bytes += p.size();
    }
  } else if (per_token > 0) {
    int64_t bytes = 0;
    for (std::string_view p : pieces) bytes += static_cast<int64_t>(p.size());
    const int64_t at_least = (bytes + per_token - 1) / per_token;
    if (text_tokens + at_least > options_.max_seq) {
      return skip(
          "text_too_long",
          absl::StrCat(files.key, ": ", bytes, " bytes of text are at least ", at_least,
                       " text tokens (one stands for at most ", per_token,
                       " bytes), not tokenized; the maximum sequence is ", options_.max_seq));
    }
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].empty()) continue;
    absl::Status s;
    if (chat) {
      // The loss spans that fall in this piece, in its own offsets.
      std::vector<Tokenizer::Span> spans;
      const size_t b = piece_at[i], e = b + pieces[i].size();
      for (const Tokenizer::Span& l : rendered.loss) {
        if (l.end > b && l.begin < e) {
          spans.push_back({std::max(l.begin, b) - b, std::min(l.end, e) - b});
        }
      }
      s = tokenizer_->EncodeMarked(pieces[i], spans, &piece_ids[i], &piece_marks[i]);
    } else {
      s = tokenizer_->Encode(pieces[i], &piece_ids[i]);
    }
    if (!s.ok()) return skip("invalid_utf8", std::string(s.message()));
    text_tokens += static_cast<int>(piece_ids[i].size());
  }
  if (text_tokens > options_.max_seq && !options_.truncate) {
    return skip("text_too_long", absl::StrCat(text_tokens, " text tokens; the maximum sequence is ",
                                              options_.max_seq));
  }

  // Image headers: sizes, grids, token counts.
  const int n = static_cast<int>(image_bytes.size());
  const int per_image = n == 0 ? 0 : std::max(1, options_.max_tiles / n);
  int image_tokens = 0;
  for (int i = 0; i < n + outputs; ++i) {
    const bool output = i >= n;
    const std::string name =
        files.key + "." + (output ? record.output_images(i - n) : record.images(i));
    absl::StatusOr<ImageInfo> info =
        PeekChecked(output ? *output_bytes[i - n] : *image_bytes[i], options_.decode);
    if (!info.ok()) {
      return skip(ImageErrorReason(info.status()),
                  name + ": " + std::string(info.status().message()));
    }
    if (output) {
      out.sample.output_images.push_back(*info);  // tiles 1
      continue;
    }
    if (!options_.image_to_tile) {  // else one tile, grid 1 x 1
      info->grid = ChooseTileGrid(info->width, info->height, per_image, options_.tile_size);
      info->tiles = TileCount(info->grid, options_.thumbnail);
    }
    image_tokens += info->tiles * options_.tokens_per_tile;
    out.sample.images.push_back(*info);
  }
  int query_tokens = outputs * options_.gen_queries;
  // The token slots marker m stands for: an image's tiles' tokens, or an
  // output image's query positions.
  auto marker_slots = [&](int m) {
    return output_marker[m] ? options_.gen_queries
                            : out.sample.images[marker_image[m]].tiles * options_.tokens_per_tile;
  };
  // Truncation: the sequence <s> piece0 marker0 piece1 ... </s> keeps its
  // first max_seq tokens; a piece may be cut, an image's slots or an output
  // image's queries never (the first that does not fit whole goes with
  // everything after it), and a cut sample has no </s>.
  int kept_markers = markers;
  bool keep_eos = !chat;
  if (text_tokens + image_tokens + query_tokens > options_.max_seq) {
    if (!options_.truncate) {
      return skip("sequence_too_long",
                  absl::StrCat(text_tokens, " text + ", image_tokens, " image + ", query_tokens,
                               " query tokens; the maximum sequence is ", options_.max_seq));
    }
    const int total = text_tokens + image_tokens + query_tokens;
    int used = !chat && tokenizer_->bos_id() >= 0 ? 1 : 0;
    bool cut = false;
    kept_markers = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (cut) {
        piece_ids[i].clear();
        piece_marks[i].clear();
        continue;
      }
      const int room = options_.max_seq - used;
      if (static_cast<int>(piece_ids[i].size()) > room) {
        piece_ids[i].resize(static_cast<size_t>(room));
        if (chat) piece_marks[i].resize(static_cast<size_t>(room));
        cut = true;
      }
      used += static_cast<int>(piece_ids[i].size());
      if (cut || static_cast<int>(i) >= markers) continue;
      const int slots = marker_slots(static_cast<int>(i));
      if (used + slots > options_.max_seq) {
        cut = true;
        continue;
      }
      used += slots;
      kept_markers = static_cast<int>(i) + 1;
    }
    keep_eos = false;  // a cut sample does not end
    out.sample.truncated_tokens = total - used;
    const int kept_outputs = static_cast<int>(
        std::count(output_marker.begin(), output_marker.begin() + kept_markers, true));
    out.sample.images.resize(static_cast<size_t>(kept_markers - kept_outputs));
    out.sample.output_images.resize(static_cast<size_t>(kept_outputs));
    text_tokens = 0;
    image_tokens = 0;
    for (const auto& ids : piece_ids) text_tokens += static_cast<int>(ids.size());
    if (!chat && tokenizer_->bos_id() >= 0) ++text_tokens;
    for (const ImageInfo& info : out.sample.images)
      image_tokens += info.tiles * options_.tokens_per_tile;
    query_tokens = kept_outputs * options_.gen_queries;
  }
  const int kept_images = static_cast<int>(out.sample.images.size());

  // Pixels.
  Sample& sample = out.sample.sample;
  if (decode_pixels) {
    for (int i = 0; i < kept_images; ++i) {
      const ImageInfo& info = out.sample.images[i];
      const int S = options_.tile_size;
      const bool own_tile = static_cast<bool>(options_.image_to_tile);
      absl::StatusOr<Image> image = own_tile ? DecodeImage(*image_bytes[i], options_.decode)
                                             : DecodeImage(*image_bytes[i], options_.decode,
                                                           info.grid.cols * S, info.grid.rows * S);
      if (!image.ok()) {
        return skip(ImageErrorReason(image.status()), files.key + "." + record.images(i) + ": " +
                                                          std::string(image.status().message()));
      }
      if (own_tile) {
        absl::StatusOr<std::vector<float>> tile = options_.image_to_tile(*image);
        if (!tile.ok()) {
          return skip(ImageErrorReason(tile.status()), files.key + "." + record.images(i) + ": " +
                                                           std::string(tile.status().message()));
        }
        sample.tiles.insert(sample.tiles.end(), tile->begin(), tile->end());
      } else {
        AppendTiles(*image, info.grid, options_, &sample.tiles);
      }
      sample.num_tiles += info.tiles;
    }
    for (size_t i = 0; i < out.sample.output_images.size(); ++i) {
      const int S = options_.gen_image_size;
      absl::StatusOr<Image> image = DecodeImage(*output_bytes[i], options_.decode, S, S);
      if (!image.ok()) {
        return skip(ImageErrorReason(image.status()), files.key + "." + record.output_images(i) +
                                                          ": " +
                                                          std::string(image.status().message()));
      }
      AppendGenImage(*image, S, &sample.gen_images);
      ++sample.num_gen_images;
    }
  }

  // Tokens: <s> piece0 [marker0 slots] piece1 ... </s>; a conversation:
  // piece0 [marker0 slots] piece1 ..., with its loss marks.
  sample.tokens.reserve(text_tokens + image_tokens + query_tokens);
  if (!chat && tokenizer_->bos_id() >= 0) sample.tokens.push_back(tokenizer_->bos_id());
  for (size_t i = 0; i < pieces.size(); ++i) {
    sample.tokens.insert(sample.tokens.end(), piece_ids[i].begin(), piece_ids[i].end());
    if (chat)
      sample.loss_mask.insert(sample.loss_mask.end(), piece_marks[i].begin(), piece_marks[i].end());
    if (static_cast<int>(i) < kept_markers) {
      const int m = static_cast<int>(i);
      const size_t slots = static_cast<size_t>(marker_slots(m));
      sample.tokens.insert(sample.tokens.end(), slots, output_marker[m] ? kQueryToken : -1);
      if (chat) sample.loss_mask.insert(sample.loss_mask.end(), slots, 0);
    }
  }
  if (keep_eos) sample.tokens.push_back(tokenizer_->eos_id());
  out.sample.image_tokens = image_tokens;
  out.sample.text_tokens = text_tokens;
  out.sample.query_tokens = query_tokens;
  out.sample.loss_tokens = static_cast<int>(LossTokens(sample));
  if (out.sample.truncated_tokens > 0 && out.sample.loss_tokens == 0) {
    return skip("sequence_too_long",
                absl::StrCat("nothing to train on in the first ", options_.max_seq,
                             " tokens (the maximum sequence)"));
  }
  int tiles = 0;
  for (const auto& image : out.sample.images) tiles += image.tiles;
  const int64_t vit_tokens = int64_t{tiles} * options_.vit_tokens_per_tile;
  if (options_.caps.encoder > 0 && vit_tokens > options_.caps.encoder) {
    return skip("over_token_cap",
                absl::StrCat(vit_tokens, " ViT tokens (", tiles,
                             " tiles), above parallel.encoder_max_tokens ", options_.caps.encoder));
  }
  const int64_t length = static_cast<int64_t>(sample.tokens.size());
  if (options_.caps.llm > 0 && length > options_.caps.llm) {
    return skip(
        "over_token_cap",
        absl::StrCat(length, " LLM tokens, above parallel.llm_max_tokens ", options_.caps.llm));
  }
  out.ok = true;
  return out;
}

data::v1::ScanRecord ScanRecordOf(const ProcessedSample& s, int gen_patches_per_image) {
  data::v1::ScanRecord r;
  r.set_key(s.key);
  for (const ImageInfo& info : s.images) r.add_images(info.tiles);
  r.set_image_tokens(s.image_tokens);
  r.set_text_tokens(s.text_tokens);
  r.set_loss_tokens(s.loss_tokens);
  for (size_t i = 0; i < s.output_images.size(); ++i) r.add_output_images(gen_patches_per_image);
  r.set_query_tokens(s.query_tokens);
  return r;
}

}  // namespace loom::data
