#include "runtime/base/log.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace loom::log {
namespace {

std::atomic<int> g_min_level{static_cast<int>(Level::kInfo)};

// Settings that change rarely; guarded by a mutex, read per record.
std::mutex g_mu;
std::string* g_service = new std::string("loom");  // never freed: used at exit
std::function<void(std::string_view)>* g_sink = nullptr;

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

void WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n <= 0) return;  // nowhere left to report a failed log write
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

std::string_view LevelName(Level level) {
  switch (level) {
    case Level::kDebug:
      return "DEBUG";
    case Level::kInfo:
      return "INFO";
    case Level::kWarning:
      return "WARNING";
    case Level::kError:
      return "ERROR";
    case Level::kFatal:
      return "FATAL";
  }
  return "UNKNOWN";
}

bool ParseLevel(std::string_view text, Level* level) {
  std::string lower = absl::AsciiStrToLower(std::string(text));
  for (Level l : {Level::kDebug, Level::kInfo, Level::kWarning, Level::kError}) {
    if (lower == absl::AsciiStrToLower(std::string(LevelName(l)))) {
      *level = l;
      return true;
    }
  }
  return false;
}

void SetServiceName(std::string name) {
  std::lock_guard<std::mutex> lock(g_mu);
  *g_service = std::move(name);
}

void SetMinLevel(Level level) { g_min_level = static_cast<int>(level); }

Level MinLevel() { return static_cast<Level>(g_min_level.load()); }

void SetSinkForTesting(std::function<void(std::string_view)> sink) {
  std::lock_guard<std::mutex> lock(g_mu);
  delete g_sink;
  g_sink = sink ? new std::function<void(std::string_view)>(std::move(sink)) : nullptr;
}

void AppendJsonString(std::string_view text, std::string* out) {
  out->push_back('"');
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

LogLine::LogLine(Level level, const char* file, int line)
    : level_(level),
      enabled_(level == Level::kFatal || static_cast<int>(level) >= g_min_level.load()) {
  if (enabled_) {
    AppendKey("src");
    AppendJsonString(absl::StrCat(Basename(file), ":", line), &fields_);
  }
}

void LogLine::AppendKey(std::string_view key) {
  fields_.push_back(',');
  AppendJsonString(key, &fields_);
  fields_.push_back(':');
}

LogLine& LogLine::With(std::string_view key, std::string_view value) {
  if (!enabled_) return *this;
  AppendKey(key);
  AppendJsonString(value, &fields_);
  return *this;
}

LogLine& LogLine::With(std::string_view key, bool value) {
  if (!enabled_) return *this;
  AppendKey(key);
  fields_.append(value ? "true" : "false");
  return *this;
}

LogLine& LogLine::With(std::string_view key, double value) {
  if (!enabled_) return *this;
  AppendKey(key);
  if (std::isfinite(value)) {
    absl::StrAppend(&fields_, value);
  } else {
    AppendJsonString(absl::StrCat(value), &fields_);  // JSON has no NaN/inf
  }
  return *this;
}

LogLine& LogLine::WithInt(std::string_view key, int64_t value) {
  if (!enabled_) return *this;
  AppendKey(key);
  absl::StrAppend(&fields_, value);
  return *this;
}

LogLine::~LogLine() {
  if (!enabled_) return;
  std::string out = "{\"ts\":";
  AppendJsonString(absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone()),
                   &out);
  out.append(",\"level\":");
  AppendJsonString(LevelName(level_), &out);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    out.append(",\"service\":");
    AppendJsonString(*g_service, &out);
  }
  out.append(",\"msg\":");
  AppendJsonString(message_.str(), &out);
  out.append(fields_);
  out.append("}\n");
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_sink != nullptr) {
      (*g_sink)(out);
    } else {
      WriteAll(STDERR_FILENO, out);
    }
  }
  if (level_ == Level::kFatal) std::abort();
}

}  // namespace loom::log
