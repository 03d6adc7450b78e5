// A process's incarnation: 16 random bytes drawn once when it starts,
// which loom-scheduler binds to the rank the process registers
// (RegisterWorkerRequest.incarnation). Every worker holds the same
// certificate, so the certificate cannot say which rank a caller holds; the
// incarnation can, because only the process and loom-scheduler know it
// (it travels only to loom-scheduler, over mutual TLS). Its public name,
// ServiceInfo.instance, tells one process at an endpoint from the next
// without giving the incarnation away.
#ifndef LOOM_SERVICES_COMMON_INCARNATION_H_
#define LOOM_SERVICES_COMMON_INCARNATION_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace loom {

inline constexpr size_t kIncarnationBytes = 16;

// This process's, drawn on first use.
const std::string& ProcessIncarnation();
// A fresh one (a process standing for many ranks: scale_bench, tests).
std::string NewIncarnation();
// The public name of `incarnation`: 16 hex digits, SipHash-2-4 of a fixed
// string under the incarnation as key (a pseudorandom function: the name
// reveals nothing of the key).
std::string IncarnationInstance(absl::string_view incarnation);

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_INCARNATION_H_
