#include "runtime/data/convert.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/data/image.h"
#include "runtime/data/shard.h"
#include "runtime/data/tokenizer.h"

namespace loom::data {
namespace {

using nlohmann::ordered_json;

struct Skip {
  std::string reason;
  std::string detail;
};

const char* Extension(ImageFormat f) {
  switch (f) {
    case ImageFormat::kPng:
      return "png";
    case ImageFormat::kJpeg:
      return "jpg";
    case ImageFormat::kWebp:
      return "webp";
    case ImageFormat::kGif:
      return "gif";
    case ImageFormat::kBmp:
      return "bmp";
    default:
      return nullptr;
  }
}

size_t Count(const std::string& s, std::string_view what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

// A record as messages and image paths, or why not.
struct Record {
  std::string id;
  std::vector<std::pair<std::string, std::string>> messages;  // role, content
  std::vector<std::string> images;                            // paths, in order
  std::vector<std::string> output_images;                     // paths, in order
  std::optional<std::vector<std::string>> frames;             // a video's
};

std::optional<Skip> Parse(const ordered_json& r, const std::string& images_dir, Record* out) {
  if (!r.is_object()) return Skip{"bad_record", "not a JSON object"};
  if (r.contains("id")) out->id = r["id"].is_string() ? r["id"].get<std::string>() : r["id"].dump();
  auto strings = [](const ordered_json& v, std::vector<std::string>* into) {
    if (v.is_string()) {
      into->push_back(v.get<std::string>());
      return true;
    }
    if (!v.is_array()) return false;
    for (const ordered_json& e : v) {
      if (!e.is_string()) return false;
      into->push_back(e.get<std::string>());
    }
    return true;
  };
  for (const char* key : {"image", "images"}) {
    if (r.contains(key) && !r[key].is_null() && !strings(r[key], &out->images)) {
      return Skip{"bad_record",
                  absl::StrCat("\"", key, "\" is neither a path nor a list of paths")};
    }
  }
  for (const char* key : {"output_image", "output_images"}) {
    if (r.contains(key) && !r[key].is_null() && !strings(r[key], &out->output_images)) {
      return Skip{"bad_record",
                  absl::StrCat("\"", key, "\" is neither a path nor a list of paths")};
    }
  }
  if (!r.contains("conversations") && !r.contains("messages")) {
    // A text → image pair: the prompt, and the picture to draw from it.
    // ({"caption", "image"} is image → text in most data sets: not read.)
    if (r.contains("prompt")) {
      if (!r["prompt"].is_string() || out->images.size() != 1 || !out->output_images.empty()) {
        return Skip{"bad_record", "a text → image pair is a \"prompt\" string and one \"image\""};
      }
      out->output_images = std::move(out->images);
      out->images.clear();
      out->messages = {{"user", r["prompt"].get<std::string>()},
                       {"assistant", std::string(kOutputImageMarker)}};
      return std::nullopt;
    }
  }
  if (r.contains("video") && !r["video"].is_null()) {
    std::vector<std::string> frames;
    if (r["video"].is_string()) {
      const std::filesystem::path dir =
          std::filesystem::path(images_dir) / r["video"].get<std::string>();
      std::error_code ec;
      if (!std::filesystem::is_directory(dir, ec)) {
        return Skip{"missing_image", absl::StrCat("video folder ", dir.string(), " not found")};
      }
      for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        if (e.is_regular_file()) {
          frames.push_back(
              (std::filesystem::path(r["video"].get<std::string>()) / e.path().filename())
                  .string());
        }
      }
      std::sort(frames.begin(), frames.end());
      if (frames.empty())
        return Skip{"missing_image", "video folder " + dir.string() + " is empty"};
    } else if (!strings(r["video"], &frames)) {
      return Skip{"bad_record", "\"video\" is neither a folder nor a list of frames"};
    }
    out->frames = frames;
  }
  if (r.contains("conversations")) {
    const ordered_json& c = r["conversations"];
    if (!c.is_array() || c.empty())
      return Skip{"bad_record", "\"conversations\" is not a non-empty list"};
    for (const ordered_json& turn : c) {
      if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() ||
          !turn.contains("value") || !turn["value"].is_string()) {
        return Skip{"bad_record", "a turn without a \"from\" and a \"value\" string"};
      }
      const std::string from = turn["from"].get<std::string>();
      const std::string role = from == "human" || from == "user"      ? "user"
                               : from == "gpt" || from == "assistant" ? "assistant"
                               : from == "system"                     ? "system"
                                                                      : "";
      if (role.empty()) return Skip{"bad_record", absl::StrCat("a turn from \"", from, "\"")};
      out->messages.push_back({role, turn["value"].get<std::string>()});
    }
    return std::nullopt;
  }
  if (r.contains("messages")) {
    const ordered_json& m = r["messages"];
    if (!m.is_array() || m.empty())
      return Skip{"bad_record", "\"messages\" is not a non-empty list"};
    for (const ordered_json& msg : m) {
      if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string() ||
          !msg.contains("content")) {
        return Skip{"bad_record", "a message without a \"role\" and \"content\""};
      }
      const std::string role = msg["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant") {
        return Skip{"bad_record", absl::StrCat("a message from \"", role, "\"")};
      }
      std::string content;
      const ordered_json& c = msg["content"];
      if (c.is_string()) {
        content = c.get<std::string>();
      } else if (c.is_array()) {
        for (const ordered_json& part : c) {
          const std::string type = part.is_object() ? part.value("type", "") : "";
          if (type == "text" && part.contains("text") && part["text"].is_string()) {
            content += part["text"].get<std::string>();
          } else if (type == "image") {
            content += kImageMarker;
          } else {
            return Skip{"bad_record", "a content part that is neither text nor image"};
          }
        }
      } else {
        return Skip{"bad_record", "content is neither a string nor a list of parts"};
      }
      out->messages.push_back({role, content});
    }
    return std::nullopt;
  }
  return Skip{"bad_record",
              "neither \"conversations\" (LLaVA), \"messages\" nor a \"prompt\" with its "
              "\"image\""};
}

// The record's messages with one marker per image, and its image files.
std::optional<Skip> Complete(Record* rec) {
  if (rec->frames) {
    const size_t n = rec->frames->size();
    std::string markers;
    for (size_t i = 0; i < n; ++i) markers += kImageMarker;
    bool placed = false;
    for (auto& [role, content] : rec->messages) {
      if (!placed && absl::StrContains(content, "<video>")) {
        content = absl::StrReplaceAll(content, {{"<video>", markers}});
        placed = true;
      }
    }
    if (!placed) {
      for (auto& [role, content] : rec->messages) {
        if (role == "user") {
          content = markers + "\n" + content;
          placed = true;
          break;
        }
      }
    }
    if (!placed) return Skip{"bad_record", "a video without a user message to place it in"};
    // The frames follow the record's images (a record has both rarely;
    // its "<video>" then comes after its "<image>"s).
    rec->images.insert(rec->images.end(), rec->frames->begin(), rec->frames->end());
  }
  size_t markers = 0;
  for (const auto& [role, content] : rec->messages) markers += Count(content, kImageMarker);
  if (markers == 0 && !rec->images.empty()) {
    std::string prefix;
    for (size_t i = 0; i < rec->images.size(); ++i) prefix += kImageMarker;
    for (auto& [role, content] : rec->messages) {
      if (role == "user") {
        content = prefix + "\n" + content;
        markers = rec->images.size();
        break;
      }
    }
  }
  if (markers != rec->images.size()) {
    return Skip{"image_count_mismatch",
                absl::StrCat(markers, " <image> markers, ", rec->images.size(), " images")};
  }
  size_t outputs = 0;
  for (const auto& [role, content] : rec->messages) outputs += Count(content, kOutputImageMarker);
  if (outputs != rec->output_images.size()) {
    return Skip{"image_count_mismatch", absl::StrCat(outputs, " <output_image> markers, ",
                                                     rec->output_images.size(), " output images")};
  }
  return std::nullopt;
}

// The image at `rel` under `dir`, checked: its bytes and extension.
std::optional<Skip> ReadImage(const std::string& dir, const std::string& rel, int64_t max_bytes,
                              TarMember* member) {
  const std::filesystem::path root = std::filesystem::weakly_canonical(dir);
  const std::filesystem::path path = std::filesystem::weakly_canonical(root / rel);
  const std::string r = root.string(), p = path.string();
  if (p.size() <= r.size() || p.compare(0, r.size(), r) != 0 || p[r.size()] != '/') {
    return Skip{"unreadable_image", absl::StrCat(rel, ": outside the images folder")};
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return Skip{"missing_image", absl::StrCat(rel, ": not found under ", dir)};
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || static_cast<int64_t>(size) > max_bytes) {
    return Skip{"unreadable_image",
                absl::StrCat(rel, ": ", ec ? ec.message() : "over the size limit")};
  }
  absl::StatusOr<std::string> bytes = ReadFile(p);
  if (!bytes.ok())
    return Skip{"unreadable_image", absl::StrCat(rel, ": ", bytes.status().message())};
  if (bytes->empty()) return Skip{"unreadable_image", rel + ": 0 bytes"};
  const char* ext = Extension(SniffImageFormat(*bytes));
  if (ext == nullptr) return Skip{"unreadable_image", rel + ": not PNG, JPEG, WebP, GIF or BMP"};
  if (absl::StatusOr<ImageSize> s = PeekImageSize(*bytes); !s.ok()) {
    return Skip{"unreadable_image", absl::StrCat(rel, ": ", s.status().message())};
  }
  member->name = ext;
  member->bytes = std::move(*bytes);
  return std::nullopt;
}

}  // namespace

absl::StatusOr<ConvertSummary> Convert(const ConvertOptions& o) {
  if (o.input.empty()) return absl::InvalidArgumentError("--input is required");
  if (o.out.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.samples_per_shard <= 0)
    return absl::InvalidArgumentError("--samples_per_shard must be > 0");
  std::ifstream in(o.input, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(o.input, ": cannot be read"));
  // A JSON array, read whole; else JSON lines, one at a time.
  char first = 0;
  while (in.get(first) && std::isspace(static_cast<unsigned char>(first))) {
  }
  const bool array = first == '[';
  in.clear();
  in.seekg(0);
  ordered_json all;
  if (array) {
    all = ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!all.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.input, ": not a JSON array (nor JSON lines)"));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return absl::InternalError(absl::StrCat(o.out, ": ", ec.message()));

  ConvertSummary summary;
  int64_t reported = -1;  // records read at the last progress report
  std::vector<TarMember> shard;
  int in_shard = 0;
  auto flush = [&]() -> absl::Status {
    if (in_shard == 0) return absl::OkStatus();
    const std::string path =
        absl::StrFormat("%s/%s-%05d.tar", o.out, o.name, static_cast<int>(summary.shards.size()));
    if (absl::Status s = WriteTar(path, shard); !s.ok()) return s;
    summary.shards.push_back(path);
    shard.clear();
    in_shard = 0;
    if (o.progress) o.progress(summary.read, summary.written);
    reported = summary.read;
    return absl::OkStatus();
  };
  auto skip = [&](const Skip& s, int64_t index, const std::string& id) {
    ++summary.skipped[s.reason];
    if (summary.examples.size() < 20) {
      summary.examples.push_back(absl::StrCat(
          "record ", index, id.empty() ? "" : " (id " + id + ")", ": ", s.reason, ": ", s.detail));
    }
  };
  auto one = [&](const ordered_json& r, int64_t index) -> absl::Status {
    ++summary.read;
    Record rec;
    if (std::optional<Skip> s = Parse(r, o.images, &rec))
      return skip(*s, index, rec.id), absl::OkStatus();
    if (std::optional<Skip> s = Complete(&rec)) return skip(*s, index, rec.id), absl::OkStatus();
    const std::string key = absl::StrFormat("%09d", index);
    std::vector<TarMember> files;
    ordered_json record;
    record["messages"] = ordered_json::array();
    for (const auto& [role, content] : rec.messages) {
      record["messages"].push_back({{"role", role}, {"content", content}});
    }
    for (const bool output : {false, true}) {
      const std::vector<std::string>& paths = output ? rec.output_images : rec.images;
      if (output && paths.empty()) continue;
      const char* field = output ? "output_images" : "images";
      record[field] = ordered_json::array();
      for (size_t i = 0; i < paths.size(); ++i) {
        TarMember m;
        if (std::optional<Skip> s = ReadImage(o.images, paths[i], o.max_image_bytes, &m)) {
          return skip(*s, index, rec.id), absl::OkStatus();
        }
        const std::string ext = absl::StrCat(output ? "out" : "", i, ".", m.name);
        record[field].push_back(ext);
        m.name = key + "." + ext;
        files.push_back(std::move(m));
      }
    }
    if (!rec.id.empty()) record["id"] = rec.id;
    shard.push_back(
        {key + ".json", record.dump(-1, ' ', false, ordered_json::error_handler_t::replace)});
    for (TarMember& m : files) shard.push_back(std::move(m));
    ++summary.written;
    if (++in_shard == o.samples_per_shard) return flush();
    return absl::OkStatus();
  };
  if (array) {
    for (size_t i = 0; i < all.size(); ++i) {
      if (absl::Status s = one(all[i], static_cast<int64_t>(i)); !s.ok()) return s;
    }
  } else {
    std::string line;
    int64_t index = 0;
    while (std::getline(in, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const ordered_json r = ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (r.is_discarded()) {
        ++summary.read;
        skip({"bad_record", "not valid JSON"}, index++, "");
        continue;
      }
      if (absl::Status s = one(r, index++); !s.ok()) return s;
    }
  }
  if (absl::Status s = flush(); !s.ok()) return s;
  if (o.progress && reported != summary.read) o.progress(summary.read, summary.written);
  return summary;
}

}  // namespace loom::data
