// A minimal HTTP/1.0 GET client over a TCP socket, enough to scrape a
// Prometheus /metrics endpoint from tests and the launcher.
#ifndef LOOM_SERVICES_COMMON_HTTP_GET_H_
#define LOOM_SERVICES_COMMON_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom {

struct HttpResponse {
  int status_code = 0;
  std::string content_type;
  std::string body;
};

// GET http://host:port/path. Errors: cannot connect (UNAVAILABLE), nothing
// within `timeout` (DEADLINE_EXCEEDED), a reply that is not HTTP (INTERNAL).
// A non-200 reply is returned, not an error.
absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                     absl::Duration timeout);

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_HTTP_GET_H_
