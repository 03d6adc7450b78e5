#include "runtime/comm/collective.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace loom {

absl::Status InMemoryStore::Set(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  values_[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [&] { return values_.count(key) > 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("store key \"", key, "\" not set within ", absl::FormatDuration(timeout)));
  }
  return values_[key];
}

namespace {

// Gloo's Store interface over a KeyValueStore. Gloo expects exceptions.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(KeyValueStore* store, absl::Duration timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = store_->Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = store_->Get(key, timeout_);
    if (!v.ok()) throw std::runtime_error(std::string(v.status().message()));
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, ToChrono(timeout_)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& k : keys) {
      absl::StatusOr<std::string> v = store_->Get(k, absl::FromChrono(timeout));
      if (!v.ok()) throw std::runtime_error(std::string(v.status().message()));
    }
  }

 private:
  static std::chrono::milliseconds ToChrono(absl::Duration d) {
    return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
  }
  KeyValueStore* store_;
  absl::Duration timeout_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, absl::Duration timeout)
      : context_(std::move(context)), timeout_(timeout) {}
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  absl::Status AllreduceSum(float* data, int64_t n) override {
    return Allreduce(data, n, &gloo::sum<float>);
  }
  absl::Status AllreduceSum(double* data, int64_t n) override {
    return Allreduce(data, n, &gloo::sum<double>);
  }
  absl::Status AllreduceMax(float* data, int64_t n) override {
    return Allreduce(data, n, &gloo::max<float>);
  }

 private:
  template <typename T>
  absl::Status Allreduce(T* data, int64_t n,
                         void (*reduce)(void*, const void*, const void*, size_t)) {
    if (size() == 1 || n == 0) return absl::OkStatus();
    try {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, static_cast<size_t>(n));
      opts.setReduceFunction(reduce);
      opts.setTag(tag_++);
      opts.setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
      gloo::allreduce(opts);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("Gloo allreduce over ", size(), " ranks failed: ", e.what()));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<gloo::Context> context_;
  absl::Duration timeout_;
  uint32_t tag_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(KeyValueStore* store,
                                                          const GlooOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("Gloo group \"", options.prefix, "\": rank ",
                                                   options.rank, " is not in [0, ", options.size,
                                                   ")"));
  }
  try {
    gloo::transport::tcp::attr attr;
    if (!options.host.empty()) attr.hostname = options.host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    GlooStore base(store, options.timeout);
    gloo::rendezvous::PrefixStore prefixed(options.prefix, base);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout)));
    context->connectFullMesh(prefixed, device);
    return std::unique_ptr<Communicator>(new GlooCommunicator(context, options.timeout));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("Gloo group \"", options.prefix, "\" rank ",
                                               options.rank, " of ", options.size,
                                               ": cannot connect: ", e.what()));
  }
}

}  // namespace loom
