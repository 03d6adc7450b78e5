#include "runtime/base/open_files.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "runtime/base/log.h"

namespace loom {

long RaiseOpenFileLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    LOOM_LOG(WARNING) << "getrlimit(RLIMIT_NOFILE): " << std::strerror(errno);
    return -1;
  }
  if (limit.rlim_cur == limit.rlim_max) return static_cast<long>(limit.rlim_cur);
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    LOOM_LOG(WARNING)
            .With("soft", static_cast<long>(before))
            .With("hard", static_cast<long>(limit.rlim_max))
        << "cannot raise the open-file limit to the hard limit: " << std::strerror(errno);
    return static_cast<long>(before);
  }
  return static_cast<long>(limit.rlim_cur);
}

}  // namespace loom
