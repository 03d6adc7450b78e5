// Message tags under a secret key: only the peers loom-scheduler listed can
// address a worker's receives.
//
// UCX 1.13 has no hook to refuse a peer: any process that reaches a
// worker's UCX port and knows its address can wire up to it and send tagged
// messages, and a receive takes the first message whose tag matches. So the
// tags Loom's workers exchange are not guessable: each is the SipHash-2-4 of
// its logical tag (what travels, generation, iteration, bin, stage) under a
// 128-bit key that loom-scheduler draws at random for each generation and
// hands only to the workers it registered (RegisterWorkerResponse, Regroup:
// over mutual TLS, to holders of the worker certificate). A sender without
// the key cannot name a tag that any receive waits for, and a worker cut off
// from an older generation cannot reach the newer one's receives.
//
// What this does not do: authenticate the bytes on the wire (someone who can
// read the network sees the tags and the tensors), or stop a peer from
// filling a worker's unexpected-message queue with messages that never
// match. The data plane belongs on the cluster's private network.
#ifndef LOOM_RUNTIME_COMM_DATA_KEY_H_
#define LOOM_RUNTIME_COMM_DATA_KEY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

// SipHash-2-4 (Aumasson and Bernstein, 2012) of `n` bytes under the key
// (k0, k1): the key's bytes 0-7 and 8-15, little endian.
uint64_t SipHash24(uint64_t k0, uint64_t k1, const void* data, size_t n);

// `n` bytes from the kernel's random source (getrandom(2)); aborts if it
// fails, which Linux does not do once booted.
std::string RandomBytes(size_t n);

class DataKey {
 public:
  static constexpr size_t kBytes = 16;

  // A fresh key (loom-scheduler, each generation).
  static DataKey Random();
  // The key as sent: exactly kBytes bytes.
  static absl::StatusOr<DataKey> FromBytes(absl::string_view bytes);
  std::string bytes() const;

  // The tag on the wire for `logical`: SipHash-2-4 of its 8 bytes (little
  // endian) with the top bit set, which keeps these tags apart from
  // loom-preprocess's (top bit clear; see FetchSamplesRequest.tags).
  uint64_t Tag(uint64_t logical) const;

 private:
  uint64_t k0_ = 0, k1_ = 0;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_COMM_DATA_KEY_H_
