#include "runtime/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/base/log.h"

namespace loom {
namespace {

constexpr char kPartMagic[8] = {'L', 'O', 'O', 'M', 'P', 'A', 'R', 'T'};
constexpr uint32_t kBlockBytes = 4u << 20;
constexpr char kManifestFormat[] = "loom-checkpoint";

template <typename T>
void Put(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void PutString(std::string* out, const std::string& s) {
  Put(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}

// The payload's writer: bytes straight from the caller's memory, hashed
// block by block on the way.
class PayloadWriter {
 public:
  explicit PayloadWriter(AtomicFile* file) : file_(file), state_(XXH3_createState()) {
    XXH3_64bits_reset(state_.get());
  }

  absl::Status Write(const char* p, size_t n) {
    while (n > 0) {
      const size_t take = std::min<size_t>(n, kBlockBytes - in_block_);
      XXH3_64bits_update(state_.get(), p, take);
      if (absl::Status s = file_->Write(p, take); !s.ok()) return s;
      in_block_ += take;
      p += take;
      n -= take;
      if (in_block_ == kBlockBytes) EndBlock();
    }
    return absl::OkStatus();
  }

  // The block hashes and their own hash.
  absl::Status Finish() {
    if (in_block_ > 0) EndBlock();
    std::string table(reinterpret_cast<const char*>(hashes_.data()),
                      hashes_.size() * sizeof(uint64_t));
    Put(&table, static_cast<uint64_t>(XXH3_64bits(table.data(), table.size())));
    return file_->Write(table.data(), table.size());
  }

 private:
  struct FreeState {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  void EndBlock() {
    hashes_.push_back(XXH3_64bits_digest(state_.get()));
    XXH3_64bits_reset(state_.get());
    in_block_ = 0;
  }

  AtomicFile* file_;
  std::unique_ptr<XXH3_state_t, FreeState> state_;
  size_t in_block_ = 0;
  std::vector<uint64_t> hashes_;
};

const std::vector<float>* Array(const ParamSet& p, int a) {
  const std::vector<float>& v = a == 0 ? p.data() : a == 1 ? p.adam_m() : p.adam_v();
  return v.empty() ? nullptr : &v;  // a frozen set's AdamW state
}

// Why an entry (from a part's header or a manifest) cannot be, or "".
std::string EntryError(const CheckpointPart::Entry& e) {
  if (e.shape.size() > 8) {
    return absl::StrCat("tensor '", e.name, "' has ", e.shape.size(), " dimensions");
  }
  int64_t numel = 1;
  for (int64_t d : e.shape) {
    if (d < 0 || d > (int64_t{1} << 40)) return "bad tensor shape";
    numel *= d;
    if (numel > (int64_t{1} << 40)) return "bad tensor shape";
  }
  if (e.lo < 0 || e.lo > e.hi || e.hi > numel)
    return absl::StrCat("tensor '", e.name, "': bad range");
  // Strided runs: each at least its length apart, the last within the tensor.
  const int64_t length = e.hi - e.lo;
  if (e.count < 1 || e.count > numel + 1 ||
      (e.count > 1 && (e.stride < std::max<int64_t>(length, 1) || e.stride > numel ||
                       e.count - 1 > (numel - e.hi) / e.stride))) {
    return absl::StrCat("tensor '", e.name, "': bad runs (count ", e.count, ", stride ", e.stride,
                        ")");
  }
  return "";
}

bool SameEntry(const CheckpointPart::Entry& a, const CheckpointPart::Entry& b) {
  return a.name == b.name && a.shape == b.shape && a.lo == b.lo && a.hi == b.hi &&
         a.count == b.count && (a.count == 1 || a.stride == b.stride);
}

// The format version that holds `entries`: 2 (what builds before strided
// entries read) unless one is strided.
uint32_t VersionFor(const std::vector<CheckpointPart::Entry>& entries) {
  for (const CheckpointPart::Entry& e : entries) {
    if (e.count > 1) return 3;
  }
  return 2;
}

bool ReadableVersion(uint64_t version) { return version == 2 || version == 3; }

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// A part being read: its header, and the payload fetched one verified block
// at a time.
struct PartFile {
  std::string path;
  int fd = -1;
  int64_t step = 0;
  std::vector<CheckpointPart::Entry> entries;
  int64_t elements = 0;
  uint32_t block_bytes = 0;
  int64_t payload_offset = 0;  // bytes into the file
  std::vector<uint64_t> hashes;

  PartFile() = default;
  PartFile(const PartFile&) = delete;
  PartFile& operator=(const PartFile&) = delete;
  ~PartFile() {
    if (fd >= 0) close(fd);
  }
};

absl::Status ReadAt(const PartFile& f, int64_t offset, void* dst, size_t n) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = pread(f.fd, p, n, offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("read", f.path);
    if (r == 0) return absl::DataLossError(absl::StrCat("checkpoint part ", f.path, ": truncated"));
    p += r;
    n -= static_cast<size_t>(r);
    offset += r;
  }
  return absl::OkStatus();
}

// Reads a part's header and block table; checks both hashes and the size.
absl::Status OpenPart(const std::string& path, const std::string& module, PartFile* f) {
  f->path = path;
  f->fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("checkpoint part ", path, " is missing"));
    }
    return Errno("open", path);
  }
  struct stat st;
  if (fstat(f->fd, &st) != 0) return Errno("stat", path);
  const int64_t size = st.st_size;
  auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint part ", path, ": ", what));
  };
  // The header is read piece by piece, every length bounded before use.
  std::string header;
  int64_t pos = 0;
  auto get = [&](size_t n) -> absl::Status {
    if (pos + static_cast<int64_t>(n) > size) return corrupt("truncated header");
    const size_t at = header.size();
    header.resize(at + n);
    if (absl::Status s = ReadAt(*f, pos, header.data() + at, n); !s.ok()) return s;
    pos += static_cast<int64_t>(n);
    return absl::OkStatus();
  };
  auto get_value = [&](auto* v) -> absl::Status {
    if (absl::Status s = get(sizeof(*v)); !s.ok()) return s;
    std::memcpy(v, header.data() + header.size() - sizeof(*v), sizeof(*v));
    return absl::OkStatus();
  };
  auto get_string = [&](std::string* s) -> absl::Status {
    uint32_t n = 0;
    if (absl::Status e = get_value(&n); !e.ok()) return e;
    if (n > 4096) return corrupt("a name longer than 4096 bytes");
    if (absl::Status e = get(n); !e.ok()) return e;
    s->assign(header.data() + header.size() - n, n);
    return absl::OkStatus();
  };
  if (absl::Status s = get(8); !s.ok()) return corrupt("not a Loom checkpoint part (too short)");
  if (std::memcmp(header.data(), kPartMagic, 8) != 0) {
    return corrupt("not a Loom checkpoint part (bad magic)");
  }
  uint32_t version, count;
  std::string name;
  if (absl::Status s = get_value(&version); !s.ok()) return s;
  if (!ReadableVersion(version)) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint part ", path, ": version ",
                                                      version, ", this build reads versions 2 to ",
                                                      kCheckpointVersion));
  }
  if (absl::Status s = get_string(&name); !s.ok()) return s;
  if (absl::Status s = get_value(&f->step); !s.ok()) return s;
  if (absl::Status s = get_value(&f->block_bytes); !s.ok()) return s;
  if (absl::Status s = get_value(&count); !s.ok()) return s;
  if (f->block_bytes == 0 || count > (1u << 20)) return corrupt("bad header values");
  for (uint32_t k = 0; k < count; ++k) {
    CheckpointPart::Entry e;
    uint32_t ndim;
    if (absl::Status s = get_string(&e.name); !s.ok()) return s;
    if (absl::Status s = get_value(&ndim); !s.ok()) return s;
    if (ndim > 8) return corrupt(absl::StrCat("tensor '", e.name, "' has ", ndim, " dimensions"));
    e.shape.resize(ndim);
    for (uint32_t i = 0; i < ndim; ++i) {
      if (absl::Status s = get_value(&e.shape[i]); !s.ok()) return s;
    }
    if (absl::Status s = get_value(&e.lo); !s.ok()) return s;
    if (absl::Status s = get_value(&e.hi); !s.ok()) return s;
    if (version >= 3) {
      if (absl::Status s = get_value(&e.count); !s.ok()) return s;
      if (absl::Status s = get_value(&e.stride); !s.ok()) return s;
    }
    if (std::string why = EntryError(e); !why.empty()) return corrupt(why);
    f->elements += e.elements();
    if (f->elements > (int64_t{1} << 40)) return corrupt("bad tensor ranges");
    f->entries.push_back(std::move(e));
  }
  const uint64_t want = XXH3_64bits(header.data(), header.size());
  uint64_t stored;
  if (absl::Status s = get_value(&stored); !s.ok()) return s;
  if (stored != want) return corrupt("header checksum mismatch");
  if (name != module) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint part ", path, " holds module '", name, "', not '", module, "'"));
  }
  f->payload_offset = pos;
  const int64_t payload = f->elements * 3 * static_cast<int64_t>(sizeof(float));
  const int64_t blocks = (payload + f->block_bytes - 1) / f->block_bytes;
  if (size != pos + payload + (blocks + 1) * 8) {
    return corrupt(absl::StrCat(size, " bytes where its header makes ",
                                pos + payload + blocks * 8 + 8,
                                size < pos + payload ? " (truncated)" : ""));
  }
  f->hashes.resize(static_cast<size_t>(blocks));
  if (absl::Status s = ReadAt(*f, pos + payload, f->hashes.data(), blocks * 8); !s.ok()) return s;
  if (absl::Status s = ReadAt(*f, pos + payload + blocks * 8, &stored, 8); !s.ok()) return s;
  if (stored != XXH3_64bits(f->hashes.data(), f->hashes.size() * 8)) {
    return corrupt("block table checksum mismatch");
  }
  return absl::OkStatus();
}

// One verified payload block at a time of one part (read in payload order,
// so each block is fetched once).
class BlockCache {
 public:
  absl::Status Read(const PartFile& f, int64_t offset, char* dst, int64_t n) {
    while (n > 0) {
      const int64_t block = offset / f.block_bytes;
      if (&f != part_ || block != block_) {
        if (absl::Status s = Load(f, block); !s.ok()) return s;
      }
      const int64_t in = offset - block * f.block_bytes;
      const int64_t take = std::min<int64_t>(n, static_cast<int64_t>(buffer_.size()) - in);
      std::memcpy(dst, buffer_.data() + in, static_cast<size_t>(take));
      dst += take;
      offset += take;
      n -= take;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Load(const PartFile& f, int64_t block) {
    part_ = nullptr;
    const int64_t payload = f.elements * 3 * static_cast<int64_t>(sizeof(float));
    const int64_t start = block * f.block_bytes;
    buffer_.resize(static_cast<size_t>(std::min<int64_t>(f.block_bytes, payload - start)));
    if (absl::Status s = ReadAt(f, f.payload_offset + start, buffer_.data(), buffer_.size());
        !s.ok()) {
      return s;
    }
    if (XXH3_64bits(buffer_.data(), buffer_.size()) != f.hashes[static_cast<size_t>(block)]) {
      return absl::DataLossError(
          absl::StrCat("checkpoint part ", f.path, ": checksum mismatch in block ", block));
    }
    part_ = &f;
    block_ = block;
    return absl::OkStatus();
  }

  const PartFile* part_ = nullptr;
  int64_t block_ = -1;
  std::vector<char> buffer_;
};

// Where a tensor's elements are: each piece, elements [lo, hi) of it.
struct Piece {
  int64_t lo, hi;
};

int64_t Numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// A module's manifest, read and checked.
struct Manifest {
  std::string path;
  int64_t step = 0;
  std::vector<std::string> parts;  // file names within the folder
  // What each part holds, in the order of `parts`: from the manifest's
  // "contents", or (an older manifest) from each part's header.
  std::vector<std::vector<CheckpointPart::Entry>> contents;
  bool described = false;  // the manifest had its contents
};

nlohmann::json EntryJson(const CheckpointPart::Entry& e) {
  nlohmann::json j = {{"tensor", e.name}, {"shape", e.shape}, {"lo", e.lo}, {"hi", e.hi}};
  if (e.count > 1) {
    j["count"] = e.count;
    j["stride"] = e.stride;
  }
  return j;
}

// An entry of a manifest's contents; false if it is not one.
bool ParseEntry(const nlohmann::json& j, CheckpointPart::Entry* e) {
  if (!j.is_object() || !j.contains("tensor") || !j["tensor"].is_string() || !j.contains("shape") ||
      !j["shape"].is_array() || !j.contains("lo") || !j["lo"].is_number_integer() ||
      !j.contains("hi") || !j["hi"].is_number_integer()) {
    return false;
  }
  e->name = j["tensor"].get<std::string>();
  if (j["shape"].size() > 8) return false;
  for (const nlohmann::json& d : j["shape"]) {
    if (!d.is_number_integer()) return false;
    e->shape.push_back(d.get<int64_t>());
  }
  e->lo = j["lo"].get<int64_t>();
  e->hi = j["hi"].get<int64_t>();
  if (j.contains("count") || j.contains("stride")) {  // both, or neither
    if (!j.contains("count") || !j["count"].is_number_integer() || !j.contains("stride") ||
        !j["stride"].is_number_integer()) {
      return false;
    }
    e->count = j["count"].get<int64_t>();
    e->stride = j["stride"].get<int64_t>();
  }
  return true;
}

// Opens a part of the manifest's, checks its step, and hands it out open.
absl::Status OpenManifestPart(const std::string& dir, const std::string& module, const Manifest& m,
                              size_t i, PartFile* f) {
  if (absl::Status s = OpenPart(absl::StrCat(dir, "/", m.parts[i]), module, f); !s.ok()) return s;
  if (f->step != m.step) {
    return absl::DataLossError(absl::StrCat("checkpoint ", m.path, ": part ", f->path,
                                            " is of step ", f->step, ", the manifest's ", m.step));
  }
  return absl::OkStatus();
}

// Reads and checks DIR/<module>.ckpt. Without contents, it learns them from
// the parts' headers, one part open at a time.
absl::Status ReadManifest(const std::string& dir, const std::string& module, Manifest* m) {
  m->path = ModuleManifestPath(dir, module);
  absl::StatusOr<std::string> text = ReadFile(m->path);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat("checkpoint ", m->path, " cannot be read: ", text.status().message()));
  }
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint ", m->path, ": ", what));
  };
  if (text->compare(0, 8, "LOOMCKPT") == 0) {  // version 1: the module in this one file
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", m->path,
                     " is in format version 1 (one file per module); this build reads version ",
                     kCheckpointVersion, " (a manifest and its parts)"));
  }
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("format", "") != kManifestFormat) {
    return bad("not a Loom checkpoint manifest");
  }
  if (!j.contains("version") || !j["version"].is_number_unsigned()) return bad("no version");
  if (!ReadableVersion(j["version"].get<uint64_t>())) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", m->path, ": version ", j["version"].dump(),
                     ", this build reads versions 2 to ", kCheckpointVersion));
  }
  if (!j.contains("module") || !j["module"].is_string() || !j.contains("step") ||
      !j["step"].is_number_integer() || !j.contains("parts") || !j["parts"].is_array() ||
      j["parts"].empty()) {
    return bad("missing or mistyped module, step or parts");
  }
  if (j["module"].get<std::string>() != module) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", m->path, " holds module '",
                                                   j["module"].get<std::string>(), "', not '",
                                                   module, "'"));
  }
  m->step = j["step"].get<int64_t>();
  for (const nlohmann::json& name : j["parts"]) {
    if (!name.is_string() || name.get<std::string>().empty() ||
        name.get<std::string>().find('/') != std::string::npos) {
      return bad(absl::StrCat("part ", name.dump(), " is not a file name in the folder"));
    }
    m->parts.push_back(name.get<std::string>());
  }
  m->contents.resize(m->parts.size());
  m->described = j.contains("contents");
  if (m->described) {
    const nlohmann::json& c = j["contents"];
    if (!c.is_array() || c.size() != m->parts.size()) {
      return bad("its contents are not one list per part");
    }
    for (size_t i = 0; i < m->parts.size(); ++i) {
      if (!c[i].is_array()) return bad(absl::StrCat("the contents of part ", m->parts[i]));
      int64_t elements = 0;
      for (const nlohmann::json& entry : c[i]) {
        CheckpointPart::Entry e;
        if (!ParseEntry(entry, &e)) {
          return bad(absl::StrCat("part ", m->parts[i], ": entry ", entry.dump(),
                                  " is not a tensor, shape, lo and hi (and count and stride)"));
        }
        if (std::string why = EntryError(e); !why.empty()) {
          return bad(absl::StrCat("part ", m->parts[i], ": ", why));
        }
        elements += e.elements();
        if (elements > (int64_t{1} << 40))
          return bad(absl::StrCat("part ", m->parts[i], ": bad tensor ranges"));
        m->contents[i].push_back(std::move(e));
      }
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < m->parts.size(); ++i) {
    PartFile f;  // closed at the end of each turn
    if (absl::Status s = OpenManifestPart(dir, module, *m, i, &f); !s.ok()) return s;
    m->contents[i] = std::move(f.entries);
  }
  return absl::OkStatus();
}

}  // namespace

std::string ModuleManifestPath(const std::string& dir, const std::string& module) {
  return absl::StrCat(dir, "/", module, ".ckpt");
}

std::string ModulePartName(const std::string& module, int index) {
  return absl::StrCat(module, ".part-", index);
}

std::pair<int64_t, int64_t> PartRange(int64_t total, int index, int count) {
  return ChunkRange(total, index, count);
}

CheckpointPart CheckpointPart::View(const ParamSet& set, int64_t begin, int64_t end) {
  LOOM_CHECK(0 <= begin && begin <= end && end <= set.size()) << begin << ".." << end;
  const TpShard shard = set.shard();
  CheckpointPart p;
  p.step_ = set.step();
  auto take = [&p](int64_t lo, int64_t hi) {  // flat elements [lo, hi) into the payload
    if (!p.ranges_.empty() && p.ranges_.back().second == lo) {
      p.ranges_.back().second = hi;
    } else {
      p.ranges_.push_back({lo, hi});
    }
    p.elements_ += hi - lo;
  };
  for (const ParamSpec& s : set.specs()) {
    if (s.numel == 0) {  // named by the part whose range holds its place, once per TP group
      if (begin <= s.offset && s.offset < end && shard.rank == 0) {
        p.entries_.push_back({s.name, s.master_shape, 0, 0});
      }
      continue;
    }
    // The slice's elements [lo, hi) lie in the range.
    int64_t lo = std::max(begin, s.offset) - s.offset;
    int64_t hi = std::min(end, s.offset + s.numel) - s.offset;
    if (lo >= hi) continue;
    if (s.split == Split::kReplicated && shard.size > 1) {
      // Every rank of the TP group holds it whole: each writes 1 / TP of it.
      const auto [first, last] = PartRange(hi - lo, shard.rank, shard.size);
      hi = lo + last;
      lo += first;
      if (lo >= hi) continue;
      p.entries_.push_back({s.name, s.master_shape, lo, hi});
      take(s.offset + lo, s.offset + hi);
      continue;
    }
    // The slice's runs in the master, clipped to [lo, hi), each equal-length
    // run at a constant stride from the last joining its entry.
    for (const SliceRun& r : SliceRuns(s, shard)) {
      const int64_t from = std::max(lo, r.offset), to = std::min(hi, r.offset + r.length);
      if (from >= to) continue;
      const int64_t at = r.master_offset + (from - r.offset), length = to - from;
      Entry* e =
          p.entries_.empty() || p.entries_.back().name != s.name ? nullptr : &p.entries_.back();
      if (e != nullptr && e->hi - e->lo == length) {
        if (e->count == 1 && at - e->lo >= length) {
          e->stride = at - e->lo;
          e->count = 2;
          continue;
        }
        if (e->count > 1 && at == e->lo + e->count * e->stride) {
          ++e->count;
          continue;
        }
      }
      p.entries_.push_back({s.name, s.master_shape, at, at + length});
    }
    take(s.offset + lo, s.offset + hi);
  }
  // A sharded optimizer's moments start at its shard, which must hold the part.
  const int64_t ob = set.optimizer_begin();
  LOOM_CHECK(Array(set, 1) == nullptr || (ob <= begin && end <= set.optimizer_end()))
      << "part " << begin << ".." << end << " outside the optimizer shard " << ob << ".."
      << set.optimizer_end();
  for (int a = 0; a < 3; ++a) {
    const std::vector<float>* v = Array(set, a);
    p.arrays_[a] = v == nullptr ? nullptr : v->data();
    p.shift_[a] = a == 0 ? 0 : ob;
  }
  return p;
}

CheckpointPart CheckpointPart::Snapshot(const ParamSet& set, int64_t begin, int64_t end) {
  CheckpointPart p = View(set, begin, end);
  for (int a = 0; a < 3; ++a) {
    if (p.arrays_[a] == nullptr) continue;
    p.owned_[a].reserve(static_cast<size_t>(p.elements_));
    for (const auto& [lo, hi] : p.ranges_) {
      p.owned_[a].insert(p.owned_[a].end(), p.arrays_[a] + (lo - p.shift_[a]),
                         p.arrays_[a] + (hi - p.shift_[a]));
    }
    p.arrays_[a] = p.owned_[a].data();
    p.shift_[a] = 0;
  }
  p.ranges_.assign(1, {0, p.elements_});
  return p;
}

int64_t CheckpointPart::owned_bytes() const {
  int64_t n = 0;
  for (const auto& v : owned_) n += static_cast<int64_t>(v.size() * sizeof(float));
  return n;
}

absl::Status CheckpointPart::Write(const std::string& module, const std::string& path) const {
  std::string header(kPartMagic, 8);
  const uint32_t version = VersionFor(entries_);
  Put(&header, version);
  PutString(&header, module);
  Put(&header, step_);
  Put(&header, kBlockBytes);
  Put(&header, static_cast<uint32_t>(entries_.size()));
  for (const Entry& e : entries_) {
    PutString(&header, e.name);
    Put(&header, static_cast<uint32_t>(e.shape.size()));
    for (int64_t d : e.shape) Put(&header, d);
    Put(&header, e.lo);
    Put(&header, e.hi);
    if (version >= 3) {
      Put(&header, e.count);
      Put(&header, e.stride);
    }
  }
  Put(&header, static_cast<uint64_t>(XXH3_64bits(header.data(), header.size())));
  AtomicFile file;
  if (absl::Status s = file.Open(path); !s.ok()) return s;
  if (absl::Status s = file.Write(header.data(), header.size()); !s.ok()) return s;
  PayloadWriter payload(&file);
  static const std::vector<float> zeros(1 << 18);  // a frozen module's AdamW state
  for (int a = 0; a < 3; ++a) {
    if (arrays_[a] != nullptr) {
      for (const auto& [lo, hi] : ranges_) {
        if (absl::Status s =
                payload.Write(reinterpret_cast<const char*>(arrays_[a] + (lo - shift_[a])),
                              static_cast<size_t>(hi - lo) * sizeof(float));
            !s.ok()) {
          return s;
        }
      }
      continue;
    }
    for (int64_t done = 0; done < elements_;) {
      const int64_t n = std::min<int64_t>(elements_ - done, zeros.size());
      if (absl::Status s = payload.Write(reinterpret_cast<const char*>(zeros.data()),
                                         static_cast<size_t>(n) * sizeof(float));
          !s.ok()) {
        return s;
      }
      done += n;
    }
  }
  if (absl::Status s = payload.Finish(); !s.ok()) return s;
  return file.Commit();
}

absl::Status WriteModuleManifest(const std::string& dir, const std::string& module, int64_t step,
                                 const std::vector<std::string>& parts,
                                 const std::vector<std::vector<CheckpointPart::Entry>>& contents) {
  LOOM_CHECK(contents.empty() || contents.size() == parts.size())
      << contents.size() << " contents for " << parts.size() << " parts";
  uint32_t version = 2;
  for (const std::vector<CheckpointPart::Entry>& entries : contents) {
    version = std::max(version, VersionFor(entries));
  }
  nlohmann::json j = {{"format", kManifestFormat},
                      {"version", version},
                      {"module", module},
                      {"step", step},
                      {"parts", parts}};
  std::string text = j.dump(1);
  if (!contents.empty()) {         // one line per part: thousands of parts stay readable
    text.resize(text.size() - 2);  // "\n}"
    text += ",\n \"contents\": [";
    for (size_t i = 0; i < contents.size(); ++i) {
      nlohmann::json entries = nlohmann::json::array();
      for (const CheckpointPart::Entry& e : contents[i]) entries.push_back(EntryJson(e));
      absl::StrAppend(&text, i == 0 ? "\n  " : ",\n  ", entries.dump());
    }
    text += "\n ]\n}";
  }
  return WriteFileAtomically(ModuleManifestPath(dir, module), text + "\n");
}

absl::Status DescribeModuleParts(const std::string& dir, const std::string& module) {
  Manifest m;
  if (absl::Status s = ReadManifest(dir, module, &m); !s.ok()) return s;
  if (m.described) return absl::OkStatus();
  return WriteModuleManifest(dir, module, m.step, m.parts, m.contents);
}

absl::Status SaveModuleCheckpoint(const ParamSet& params, const std::string& module,
                                  const std::string& dir) {
  const std::string name = ModulePartName(module, 0);
  const CheckpointPart part = CheckpointPart::View(params, 0, params.size());
  if (absl::Status s = part.Write(module, absl::StrCat(dir, "/", name)); !s.ok()) return s;
  return WriteModuleManifest(dir, module, params.step(), {name}, {part.entries()});
}

absl::Status LoadModuleCheckpoint(const std::string& dir, const std::string& module,
                                  ParamSet* params, bool whole_module) {
  Manifest m;
  if (absl::Status s = ReadManifest(dir, module, &m); !s.ok()) return s;
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint ", m.path, ": ", what));
  };
  // Coverage, from the manifest alone: every tensor of the set, of the
  // model's master shape, covered exactly once.
  std::map<std::string, std::pair<Shape, std::vector<const CheckpointPart::Entry*>>> tensors;
  for (const std::vector<CheckpointPart::Entry>& entries : m.contents) {
    for (const CheckpointPart::Entry& e : entries) {
      auto& [shape, held] = tensors[e.name];
      if (!held.empty() && shape != e.shape) {
        return bad(absl::StrCat("tensor '", e.name, "' has two shapes in its parts"));
      }
      shape = e.shape;
      held.push_back(&e);
    }
  }
  std::vector<Piece> pieces;  // one tensor's runs at a time
  if (whole_module && tensors.size() != params->specs().size()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", m.path, " has ", tensors.size(),
                                                   " tensors, the model has ",
                                                   params->specs().size()));
  }
  std::map<std::string, size_t> index;  // tensor name -> the set's spec
  for (size_t i = 0; i < params->specs().size(); ++i) {
    const ParamSpec& s = params->specs()[i];
    auto it = tensors.find(s.name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", m.path, " has no tensor '", s.name, "'"));
    }
    const auto& [shape, held] = it->second;
    if (shape != s.master_shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", m.path, ": tensor '", s.name, "' ", ShapeString(shape),
                       " where the model has ", ShapeString(s.master_shape)));
    }
    pieces.clear();
    for (const CheckpointPart::Entry* e : held) {
      for (int64_t k = 0; k < e->count; ++k) {
        pieces.push_back({e->lo + k * e->stride, e->hi + k * e->stride});
      }
    }
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.lo < b.lo; });
    int64_t covered = 0;
    for (const Piece& p : pieces) {
      if (p.lo != covered) break;
      covered = p.hi;
    }
    if (covered != Numel(shape)) {
      return bad(absl::StrCat("the parts do not cover tensor '", s.name, "' exactly once"));
    }
    index[s.name] = i;
  }
  // The rank's slices of each tensor, in master order (SliceRuns' order).
  std::vector<std::vector<SliceRun>> runs(params->specs().size());
  for (size_t i = 0; i < runs.size(); ++i) runs[i] = SliceRuns(params->specs()[i], params->shard());
  // Calls `read(spec, run, from, to, at)` for each slice run of the set
  // that master elements [from, to) of entry `e` of a part fill, the
  // entry's elements [at, at + to - from) in payload order.
  auto for_each_overlap = [&](const CheckpointPart::Entry& e, auto&& read) -> absl::Status {
    auto it = index.find(e.name);
    if (it == index.end()) return absl::OkStatus();  // another stage's tensor
    const std::vector<SliceRun>& r = runs[it->second];
    const int64_t length = e.hi - e.lo;
    for (int64_t k = 0; k < e.count; ++k) {
      const int64_t lo = e.lo + k * e.stride, hi = lo + length;
      auto run = std::partition_point(
          r.begin(), r.end(), [&](const SliceRun& x) { return x.master_offset + x.length <= lo; });
      for (; run != r.end() && run->master_offset < hi; ++run) {
        const int64_t from = std::max(lo, run->master_offset);
        const int64_t to = std::min(hi, run->master_offset + run->length);
        if (from >= to) continue;
        if (absl::Status s = read(it->second, *run, from, to, k * length + (from - lo)); !s.ok()) {
          return s;
        }
      }
    }
    return absl::OkStatus();
  };
  // Part by part, only those holding some of the rank's slices, one open at
  // a time; within a part array by array in payload order, so each block is
  // read once.
  const int arrays = params->frozen() ? 1 : 3;
  for (size_t i = 0; i < m.parts.size(); ++i) {
    bool needed = false;
    for (const CheckpointPart::Entry& e : m.contents[i]) {
      if (needed) break;
      absl::Status s = for_each_overlap(e, [&](size_t, const SliceRun&, int64_t, int64_t, int64_t) {
        needed = true;
        return absl::OkStatus();
      });
      if (!s.ok()) return s;
    }
    if (!needed) continue;
    PartFile f;  // closed at the end of the turn
    if (absl::Status s = OpenManifestPart(dir, module, m, i, &f); !s.ok()) return s;
    bool same = f.entries.size() == m.contents[i].size();
    for (size_t k = 0; same && k < f.entries.size(); ++k) {
      same = SameEntry(f.entries[k], m.contents[i][k]);
    }
    if (!same) {
      return absl::DataLossError(absl::StrCat("checkpoint part ", f.path,
                                              ": its header's entries are not those the manifest ",
                                              m.path, " lists for it"));
    }
    BlockCache cache;
    for (int a = 0; a < arrays; ++a) {
      float* base = a == 0   ? params->data().data()
                    : a == 1 ? params->adam_m().data()
                             : params->adam_v().data();
      // The moments of a sharded optimizer: its shard's elements alone.
      const int64_t lo = a == 0 ? 0 : params->optimizer_begin();
      const int64_t hi = a == 0 ? params->size() : params->optimizer_end();
      int64_t at = 0;  // the entry's first element in the part's arrays
      for (const CheckpointPart::Entry& e : f.entries) {
        absl::Status s = for_each_overlap(e, [&](size_t spec, const SliceRun& run, int64_t from,
                                                 int64_t to, int64_t in_entry) {
          // Master elements [from, to) are the set's [flat, flat + to - from).
          const int64_t flat =
              params->specs()[spec].offset + run.offset + (from - run.master_offset);
          const int64_t first = std::max(flat, lo), last = std::min(flat + (to - from), hi);
          if (first >= last) return absl::OkStatus();
          const int64_t offset = (a * f.elements + at + in_entry + (first - flat)) *
                                 static_cast<int64_t>(sizeof(float));
          char* dst = reinterpret_cast<char*>(base + (first - lo));
          return cache.Read(f, offset, dst, (last - first) * static_cast<int64_t>(sizeof(float)));
        });
        if (!s.ok()) return s;
        at += e.elements();
      }
    }
  }
  params->step() = m.step;
  return absl::OkStatus();
}

absl::Status LoadModuleWeights(const std::string& dir, const std::string& module, ParamSet* params,
                               bool whole_module) {
  if (absl::Status s = LoadModuleCheckpoint(dir, module, params, whole_module); !s.ok()) return s;
  for (std::vector<float>* v : {&params->adam_m(), &params->adam_v()}) {
    std::fill(v->begin(), v->end(), 0.0f);
  }
  params->step() = 0;
  return absl::OkStatus();
}

}  // namespace loom
