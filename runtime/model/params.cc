#include "runtime/model/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/matmul/bf16.h"
#include "runtime/base/log.h"

namespace loom {
namespace {

// The stream of one master tensor: FNV-1a of its name, mixed with the seed
// by SplitMix64's finaliser.
uint64_t TensorSeed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  uint64_t z = seed ^ h;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The dimension `split` divides, or -1.
int SplitDim(Split split) {
  switch (split) {
    case Split::kReplicated:
      return -1;
    case Split::kRows:
    case Split::kQkvRows:
      return 0;
    case Split::kCols:
      return 1;
  }
  return -1;
}

}  // namespace

std::vector<SliceRun> SliceRuns(const ParamSpec& s, TpShard shard) {
  const int64_t numel = NumElements(s.master_shape);
  if (s.split == Split::kReplicated || shard.size == 1) return {{0, 0, numel}};
  const int64_t rows = s.master_shape[0], cols = numel / rows;
  std::vector<SliceRun> runs;
  switch (s.split) {
    case Split::kRows: {
      const int64_t n = rows / shard.size;
      runs.push_back({shard.rank * n * cols, 0, n * cols});
      break;
    }
    case Split::kQkvRows: {
      const int64_t q = s.q_rows > 0 ? s.q_rows : rows / 3, kv = (rows - q) / 2;
      int64_t master_row = 0, slice_row = 0;
      for (const int64_t block : {q, kv, kv}) {
        const int64_t n = block / shard.size;
        runs.push_back({(master_row + shard.rank * n) * cols, slice_row * cols, n * cols});
        master_row += block;
        slice_row += n;
      }
      break;
    }
    case Split::kCols: {
      const int64_t n = cols / shard.size;
      for (int64_t r = 0; r < rows; ++r) runs.push_back({r * cols + shard.rank * n, r * n, n});
      break;
    }
    case Split::kReplicated:
      break;
  }
  return runs;
}

ParamSet::ParamSet(TpShard shard) : shard_(shard) {
  LOOM_CHECK(shard.size >= 1 && shard.rank >= 0 && shard.rank < shard.size)
      << "TP rank " << shard.rank << " of " << shard.size;
}

int ParamSet::Add(std::string name, Shape master_shape, Init init, float std, Split split,
                  int64_t q_rows) {
  LOOM_CHECK(!finalized_) << "Add after Finalize: " << name;
  ParamSpec s;
  s.name = std::move(name);
  s.master_shape = std::move(master_shape);
  s.shape = s.master_shape;
  s.split = split;
  s.q_rows = split == Split::kQkvRows ? q_rows : 0;
  if (split == Split::kQkvRows) {
    const int64_t rows = s.master_shape.at(0), q = q_rows > 0 ? q_rows : rows / 3;
    LOOM_CHECK(q > 0 && q < rows && (rows - q) % 2 == 0 && (q_rows > 0 || rows % 3 == 0))
        << s.name << ": " << rows << " rows as q (" << q << "), k and v";
  }
  const int dim = shard_.size > 1 ? SplitDim(split) : -1;
  if (dim >= 0) {
    LOOM_CHECK(static_cast<int>(s.shape.size()) > dim) << s.name << ": no dimension " << dim;
    if (split == Split::kQkvRows) {
      const int64_t rows = s.shape[0], q = q_rows > 0 ? q_rows : rows / 3;
      LOOM_CHECK(q % shard_.size == 0 && ((rows - q) / 2) % shard_.size == 0)
          << s.name << ": q (" << q << " rows) and k, v (" << (rows - q) / 2 << " each) in "
          << shard_.size << " TP parts";
    }
    const int64_t parts = shard_.size;
    LOOM_CHECK(s.shape[dim] % parts == 0) << s.name << ": dimension " << dim << " of "
                                          << ShapeString(s.shape) << " in " << parts << " parts";
    LOOM_CHECK(split != Split::kCols || s.shape.size() == 2) << s.name << ": kCols needs a matrix";
    s.shape[dim] /= shard_.size;
  }
  s.numel = NumElements(s.shape);
  s.offset = total_;
  s.init = init;
  s.std = std;
  total_ += s.numel;
  specs_.push_back(std::move(s));
  return static_cast<int>(specs_.size()) - 1;
}

void ParamSet::Finalize() {
  LOOM_CHECK(!finalized_) << "Finalize twice";
  finalized_ = true;
  data_.assign(total_, 0.0f);
  grad_.assign(total_, 0.0f);
  m_.assign(total_, 0.0f);
  v_.assign(total_, 0.0f);
}

void ParamSet::ShardOptimizer(int rank, int ranks) {
  LOOM_CHECK(finalized_) << "ShardOptimizer before Finalize";
  LOOM_CHECK(ranks >= 1 && rank >= 0 && rank < ranks) << "DP rank " << rank << " of " << ranks;
  const auto [begin, end] = ChunkRange(total_, rank, ranks);
  opt_begin_ = begin;
  opt_end_ = end;
  opt_ranks_ = ranks;
  if (frozen_) return;  // no AdamW state
  // New vectors of the chunk's size: assign() would keep the whole set's
  // capacity, and its pages (written by Finalize) resident.
  std::vector<float>(static_cast<size_t>(end - begin), 0.0f).swap(m_);
  std::vector<float>(static_cast<size_t>(end - begin), 0.0f).swap(v_);
}

void ParamSet::Initialize(uint64_t seed) {
  LOOM_CHECK(finalized_) << "Initialize before Finalize";
  std::vector<float> master;
  for (const ParamSpec& s : specs_) {
    float* p = data_.data() + s.offset;
    if (s.init != Init::kNormal) {
      std::fill(p, p + s.numel, s.init == Init::kOnes ? 1.0f : 0.0f);
      continue;
    }
    // mt19937_64 and our own Box-Muller: std::normal_distribution is not the
    // same on every standard library. The whole master tensor is drawn, so a
    // slice is the same values whatever the TP degree.
    std::mt19937_64 rng(TensorSeed(seed, s.name));
    auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0; };
    master.resize(NumElements(s.master_shape));
    for (float& x : master) {
      const double u1 = uniform(), u2 = uniform();
      x = static_cast<float>(s.std * std::sqrt(-2.0 * std::log(u1)) *
                             std::cos(6.283185307179586 * u2));
    }
    for (const SliceRun& r : SliceRuns(s, shard_)) {
      std::memcpy(p + r.offset, master.data() + r.master_offset, sizeof(float) * r.length);
    }
  }
  std::fill(m_.begin(), m_.end(), 0.0f);
  std::fill(v_.begin(), v_.end(), 0.0f);
  step_ = 0;
}

void ParamSet::ZeroGrad() {
  std::fill(grad_.begin(), grad_.end(), 0.0f);
  if (device_.placed && !frozen_) device_.grad.Zeros(grad_.size());
}

void ParamSet::Place(Backend* backend, Precision precision, bool optimizer_on_device) {
  LOOM_CHECK(finalized_) << "Place before Finalize";
  device_.precision = precision;
  device_.bf16.set_backend(precision == Precision::kBf16 ? backend : nullptr);
  // On the CPU the host vectors are the layers' memory.
  device_.placed = backend->device().type != DeviceType::kCpu;
  device_.optimizer = device_.placed && optimizer_on_device && !frozen_;
  if (device_.placed) {
    device_.data.set_backend(backend);
    device_.grad.set_backend(backend);
  }
  if (device_.optimizer) {
    device_.m.set_backend(backend);
    device_.v.set_backend(backend);
  }
  PushState();
  if (device_.placed && !frozen_) device_.grad.CopyFromHost(grad_.data(), grad_.size());
}

void ParamSet::PushState() {
  PushData();
  if (!device_.optimizer) return;
  device_.m.CopyFromHost(m_.data(), m_.size());
  device_.v.CopyFromHost(v_.data(), v_.size());
}

void ParamSet::PullState() {
  if (!device_.optimizer) return;
  Backend* b = device_.data.backend();
  b->Synchronize();
  b->CopyToHost(data_.data(), device_.data.data(), sizeof(float) * data_.size());
  b->CopyToHost(m_.data(), device_.m.data(), sizeof(float) * m_.size());
  b->CopyToHost(v_.data(), device_.v.data(), sizeof(float) * v_.size());
}

void ParamSet::WeightsStepped(Ops* ops) {
  if (!device_.optimizer) return PushData();
  if (device_.precision == Precision::kBf16) {
    ops->f32_to_bf16(device_.bf16.data(), device_.data.data(), total_);
  }
}

void ParamSet::PushData() {
  if (device_.placed) device_.data.CopyFromHost(data_.data(), data_.size());
  if (device_.precision == Precision::kBf16) {
    // Narrowed on the host (the masters live there), then copied.
    std::vector<uint16_t> bits(data_.size());
    kernels::F32ToBf16(bits.data(), data_.data(), static_cast<int64_t>(bits.size()));
    device_.bf16.CopyFromHost(bits.data(), bits.size());
  }
}

void ParamSet::PullGrads() {
  if (!device_.placed || frozen_) return;
  device_.grad.backend()->Synchronize();
  device_.grad.backend()->CopyToHost(grad_.data(), device_.grad.data(),
                                     sizeof(float) * grad_.size());
}

void ParamSet::Freeze() {
  LOOM_CHECK(finalized_) << "Freeze before Finalize";
  frozen_ = true;
  for (std::vector<float>* b : {&grad_, &m_, &v_}) std::vector<float>().swap(*b);
  if (device_.placed) {
    for (Buffer<float>* b : {&device_.grad, &device_.m, &device_.v}) b->resize(0);
  }
  device_.optimizer = false;
}

ParamSet ParamSet::MasterLayout() const {
  ParamSet master;
  for (const ParamSpec& s : specs_)
    master.Add(s.name, s.master_shape, s.init, s.std, s.split, s.q_rows);
  master.Finalize();
  return master;
}

int ParamSet::Find(const std::string& name) const {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int64_t ParamSet::MasterOffset(const ParamSet& master, const ParamSpec& s) {
  const int i = master.Find(s.name);
  LOOM_CHECK(i >= 0 && master.specs_[i].shape == s.master_shape)
      << "the master holds no tensor " << s.name << " " << ShapeString(s.master_shape);
  return master.specs_[i].offset;
}

void ParamSet::AddToMaster(ParamSet* master) const {
  const int64_t ob = optimizer_begin(), oe = optimizer_end();
  for (const ParamSpec& s : specs_) {
    if (s.split == Split::kReplicated && shard_.rank != 0) continue;
    const int64_t mo = MasterOffset(*master, s);
    for (const SliceRun& r : SliceRuns(s, shard_)) {
      const int64_t flat = s.offset + r.offset;  // the run's first element in the set
      const float* src = data_.data() + flat;
      float* dst = master->data_.data() + mo + r.master_offset;
      for (int64_t k = 0; k < r.length; ++k) dst[k] += src[k];
      if (m_.empty()) continue;  // frozen: no AdamW state, the master's stays zero
      // The moments this rank holds: the run within its optimizer shard.
      const int64_t lo = std::max(flat, ob), hi = std::min(flat + r.length, oe);
      for (auto [from, to] : {std::make_pair(&m_, &master->m_), std::make_pair(&v_, &master->v_)}) {
        for (int64_t e = lo; e < hi; ++e)
          (*to)[mo + r.master_offset + (e - flat)] += (*from)[e - ob];
      }
    }
  }
}

void ParamSet::SliceFromMaster(const ParamSet& master) {
  const int64_t ob = optimizer_begin(), oe = optimizer_end();
  for (const ParamSpec& s : specs_) {
    const int64_t mo = MasterOffset(master, s);
    for (const SliceRun& r : SliceRuns(s, shard_)) {
      const int64_t flat = s.offset + r.offset;
      std::memcpy(data_.data() + flat, master.data_.data() + mo + r.master_offset,
                  sizeof(float) * r.length);
      if (m_.empty()) continue;  // frozen: the weights only
      const int64_t lo = std::max(flat, ob), hi = std::min(flat + r.length, oe);
      if (lo >= hi) continue;
      for (auto [from, to] : {std::make_pair(&master.m_, &m_), std::make_pair(&master.v_, &v_)}) {
        std::memcpy(to->data() + (lo - ob), from->data() + mo + r.master_offset + (lo - flat),
                    sizeof(float) * (hi - lo));
      }
    }
  }
  step_ = master.step_;
}

double ParamSet::OwnedGradSumOfSquares(int64_t begin, int64_t end) const {
  double ss = 0;
  if (frozen_) return ss;
  if (end < 0) end = total_;
  for (const ParamSpec& s : specs_) {
    if (s.split == Split::kReplicated && shard_.rank != 0) continue;
    const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    const float* g = grad_.data();
    for (int64_t i = lo; i < hi; ++i) ss += static_cast<double>(g[i]) * g[i];
  }
  return ss;
}

double ParamSet::OwnedGradSumOfSquares(Ops* ops, int64_t begin, int64_t end) {
  if (!device_.optimizer) return OwnedGradSumOfSquares(begin, end);
  double ss = 0;
  // Runs of the tensors this rank owns, merged where they touch: few calls.
  int64_t run_lo = 0, run_hi = 0;
  auto flush = [&] {
    if (run_hi > run_lo) ss += ops->sum_of_squares(device_.grad.data() + run_lo, run_hi - run_lo);
    run_lo = run_hi = 0;
  };
  for (const ParamSpec& s : specs_) {
    if (s.split == Split::kReplicated && shard_.rank != 0) continue;
    const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo >= hi) continue;
    if (lo != run_hi) flush();
    if (run_hi == run_lo) run_lo = lo;
    run_hi = hi;
  }
  flush();
  return ss;
}

absl::Status GatherMaster(const ParamSet& local, Communicator* tp, ParamSet* master) {
  *master = local.MasterLayout();
  return GatherInto(local, tp, master);
}

absl::StatusOr<std::vector<float>> GatherGradients(const ParamSet& local, Communicator* tp) {
  ParamSet g = local;
  g.data() = g.grads();
  ParamSet master;
  if (absl::Status s = GatherMaster(g, tp, &master); !s.ok()) return s;
  return master.data();
}

absl::Status GatherInto(const ParamSet& part, Communicator* group, ParamSet* master) {
  part.AddToMaster(master);
  master->step() = part.step();
  if (group == nullptr || group->size() == 1) return absl::OkStatus();
  for (std::vector<float>* b : {&master->data(), &master->adam_m(), &master->adam_v()}) {
    if (part.frozen() && b != &master->data()) continue;  // no AdamW state: zeros everywhere
    if (absl::Status s = group->AllreduceSum(b->data(), static_cast<int64_t>(b->size())); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace loom
