// Structured logging: one JSON object per line on stderr.
//
//   LOOM_LOG(INFO).With("grpc_port", port) << "serving";
//   {"ts":"2026-11-22T01:15:12.123456Z","level":"INFO","service":"loom-scheduler",
//    "src":"chassis.cc:88","msg":"serving","grpc_port":40123}
//
// Debian's abseil (20220623) predates absl/log, so Loom carries this small
// logger. Fields added with With() keep their JSON types (numbers, booleans,
// strings); the streamed text becomes "msg". A record is written with a single
// write(2) when the LogLine is destroyed, so lines from concurrent threads do
// not interleave. LOOM_LOG(FATAL) writes its record, then aborts.
//
// Thread-safety: everything here may be called from any thread.
#ifndef LOOM_RUNTIME_BASE_LOG_H_
#define LOOM_RUNTIME_BASE_LOG_H_

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

namespace loom::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

std::string_view LevelName(Level level);
// Parses "debug", "info", "warning", "error" (any case). False if unknown.
bool ParseLevel(std::string_view text, Level* level);

// Process-wide settings, normally set once by the service chassis.
void SetServiceName(std::string name);
void SetMinLevel(Level level);
Level MinLevel();

// Replaces where finished records go (default: stderr). For tests; pass
// nullptr to restore stderr. Not to be called while other threads log.
void SetSinkForTesting(std::function<void(std::string_view line)> sink);

// Appends `text` to `out` as a quoted JSON string with escapes.
void AppendJsonString(std::string_view text, std::string* out);

// One log record under construction; written when destroyed.
class LogLine {
 public:
  LogLine(Level level, const char* file, int line);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  LogLine& With(std::string_view key, std::string_view value);
  LogLine& With(std::string_view key, const char* value) {
    return With(key, std::string_view(value));
  }
  LogLine& With(std::string_view key, const std::string& value) {
    return With(key, std::string_view(value));
  }
  LogLine& With(std::string_view key, bool value);
  LogLine& With(std::string_view key, double value);
  template <typename T,
            typename = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>>
  LogLine& With(std::string_view key, T value) {
    return WithInt(key, static_cast<int64_t>(value));
  }

  template <typename T>
  LogLine& operator<<(const T& value) {
    if (enabled_) message_ << value;
    return *this;
  }

 private:
  LogLine& WithInt(std::string_view key, int64_t value);
  void AppendKey(std::string_view key);

  Level level_;
  bool enabled_;
  std::string fields_;  // ,"key":value pairs, already JSON-encoded
  std::ostringstream message_;
};

}  // namespace loom::log

#define LOOM_LOG(severity) \
  ::loom::log::LogLine(::loom::log::Level::k##severity##_LOOM_LEVEL, __FILE__, __LINE__)
// Spelling helpers so LOOM_LOG(INFO) reads like glog.
#define kDEBUG_LOOM_LEVEL kDebug
#define kINFO_LOOM_LEVEL kInfo
#define kWARNING_LOOM_LEVEL kWarning
#define kERROR_LOOM_LEVEL kError
#define kFATAL_LOOM_LEVEL kFatal

// Programming errors crash loudly, with the condition and where it failed.
#define LOOM_CHECK(cond) \
  if (cond) {            \
  } else /* NOLINT */    \
    LOOM_LOG(FATAL).With("check", #cond) << "check failed: " #cond " "

#endif  // LOOM_RUNTIME_BASE_LOG_H_
