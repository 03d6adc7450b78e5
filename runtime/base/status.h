// Helpers for absl::Status / absl::StatusOr, the error type of every Loom API.
#ifndef LOOM_RUNTIME_BASE_STATUS_H_
#define LOOM_RUNTIME_BASE_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LOOM_STATUS_CONCAT_INNER(a, b) a##b
#define LOOM_STATUS_CONCAT(a, b) LOOM_STATUS_CONCAT_INNER(a, b)

// Returns from the current function with the status of `expr` if not OK.
#define LOOM_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status _loom_status = (expr);        \
    if (!_loom_status.ok()) return _loom_status; \
  } while (0)

// `LOOM_ASSIGN_OR_RETURN(auto x, F());` : x = *F(), or return its status.
#define LOOM_ASSIGN_OR_RETURN(lhs, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL(LOOM_STATUS_CONCAT(_loom_or_, __LINE__), lhs, expr)
#define LOOM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(*tmp)

#endif  // LOOM_RUNTIME_BASE_STATUS_H_
