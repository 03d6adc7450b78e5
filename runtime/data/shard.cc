#include "runtime/data/shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "runtime/base/file.h"
// clang-format off
#include <archive.h>
#include <archive_entry.h>
// clang-format on

namespace loom::data {
namespace {

struct ArchiveDeleter {
  void operator()(archive* a) const { archive_read_free(a); }
};
using ArchivePtr = std::unique_ptr<archive, ArchiveDeleter>;

ArchivePtr NewTarReader() {
  ArchivePtr a(archive_read_new());
  archive_read_support_format_tar(a.get());
  archive_read_support_filter_none(a.get());
  return a;
}

std::string ArchiveError(archive* a) {
  const char* s = archive_error_string(a);
  return s != nullptr ? s : "unknown libarchive error";
}

// A file read with pread from a starting offset, so several threads can
// share nothing but the path and a sample can start anywhere.
struct FileSource {
  int fd = -1;
  int64_t pos = 0;
  int64_t size = 0;
  char buf[1 << 16];
};

la_ssize_t FileRead(archive*, void* data, const void** out) {
  auto* f = static_cast<FileSource*>(data);
  for (;;) {
    ssize_t n = ::pread(f->fd, f->buf, sizeof(f->buf), f->pos);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    f->pos += n;
    *out = f->buf;
    return n;
  }
}

la_int64_t FileSkip(archive*, void* data, la_int64_t request) {
  auto* f = static_cast<FileSource*>(data);
  const la_int64_t step = std::max<la_int64_t>(0, std::min(request, f->size - f->pos));
  f->pos += step;
  return step;
}

struct Member {
  std::string key, extension;
  int64_t offset = 0;
  int64_t size = 0;
  std::string data;
};

enum class Next { kMember, kEnd, kDamaged };

// The next regular-file member with a WebDataset name. With `read_data`, its
// bytes too (unless it is over the limit: then `too_large` is set and the
// bytes are skipped). Members whose names carry no key are passed over.
Next NextMember(archive* a, bool read_data, const ShardLimits& limits, Member* m, bool* too_large,
                std::string* error) {
  *too_large = false;
  for (;;) {
    archive_entry* entry = nullptr;
    int r = archive_read_next_header(a, &entry);
    if (r == ARCHIVE_EOF) return Next::kEnd;
    if (r < ARCHIVE_WARN) {
      *error = ArchiveError(a);
      return Next::kDamaged;
    }
    const int64_t offset = archive_read_header_position(a);
    const char* name = archive_entry_pathname(entry);
    if (archive_entry_filetype(entry) != AE_IFREG || name == nullptr ||
        !SplitMemberName(name, &m->key, &m->extension)) {
      if (archive_read_data_skip(a) != ARCHIVE_OK) {
        *error = ArchiveError(a);
        return Next::kDamaged;
      }
      continue;
    }
    m->offset = offset;
    m->size = archive_entry_size(entry);
    m->data.clear();
    if (m->size < 0 || m->size > limits.max_member_bytes || !read_data) {
      *too_large = m->size < 0 || m->size > limits.max_member_bytes;
      if (archive_read_data_skip(a) != ARCHIVE_OK) {
        *error = ArchiveError(a);
        return Next::kDamaged;
      }
      return Next::kMember;
    }
    m->data.resize(static_cast<size_t>(m->size));
    size_t done = 0;
    while (done < m->data.size()) {
      la_ssize_t n = archive_read_data(a, m->data.data() + done, m->data.size() - done);
      if (n <= 0) {
        *error = n < 0 ? ArchiveError(a) : "unexpected end of member data";
        return Next::kDamaged;
      }
      done += static_cast<size_t>(n);
    }
    return Next::kMember;
  }
}

// Groups members into samples. `on_sample(first_member_offset, files)` is
// called for each complete sample; broken ones go to `broken`.
template <class OnSample>
std::string GroupMembers(archive* a, bool read_data, const ShardLimits& limits,
                         std::vector<BrokenSample>* broken, OnSample on_sample) {
  Member m;
  SampleFiles current;
  int64_t current_offset = 0;
  int members = 0;
  std::string bad_reason, bad_detail;
  auto flush = [&]() {
    if (members == 0) return;
    if (!bad_reason.empty()) {
      broken->push_back({current.key, bad_reason, bad_detail});
    } else {
      on_sample(current_offset, members, &current);
    }
    current = SampleFiles();
    members = 0;
    bad_reason.clear();
    bad_detail.clear();
  };
  for (;;) {
    bool too_large = false;
    std::string error;
    Next next = NextMember(a, read_data, limits, &m, &too_large, &error);
    if (next == Next::kEnd) {
      flush();
      return "";
    }
    if (next == Next::kDamaged) {
      // A member whose header was read but whose data broke off starts or
      // continues a sample; that sample has lost bytes. Damage at a header
      // may have cut the sample in progress short: it is reported too.
      if (!m.key.empty() && members > 0 && m.key != current.key) flush();
      if (!m.key.empty() && members == 0) current.key = m.key;
      if (members > 0 || !m.key.empty()) {
        members = std::max(members, 1);
        bad_reason = "truncated_tar";
        bad_detail = error;
        flush();
      }
      return error.empty() ? "damaged tar" : error;
    }
    if (members > 0 && m.key != current.key) flush();
    if (members == 0) {
      current.key = m.key;
      current_offset = m.offset;
    }
    ++members;
    if (too_large && bad_reason.empty()) {
      bad_reason = "member_too_large";
      bad_detail = absl::StrCat(m.key, ".", m.extension, " is ", m.size, " bytes; the limit is ",
                                limits.max_member_bytes);
    } else if (members > limits.max_members_per_sample && bad_reason.empty()) {
      bad_reason = "member_too_large";
      bad_detail = absl::StrCat("more than ", limits.max_members_per_sample, " members");
    }
    if (read_data && bad_reason.empty()) current.files[m.extension] = std::move(m.data);
    m.key.clear();
  }
}

struct OpenFile {
  FileSource source;
  ~OpenFile() {
    if (source.fd >= 0) ::close(source.fd);
  }
};

absl::Status OpenAt(const std::string& path, int64_t offset, OpenFile* file, archive* a) {
  file->source.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file->source.fd < 0) {
    std::string msg = absl::StrCat(path, ": ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  struct stat st;
  if (::fstat(file->source.fd, &st) != 0) {
    return absl::InternalError(absl::StrCat(path, ": fstat: ", std::strerror(errno)));
  }
  file->source.size = st.st_size;
  file->source.pos = offset;
  archive_read_set_read_callback(a, FileRead);
  archive_read_set_skip_callback(a, FileSkip);
  archive_read_set_callback_data(a, &file->source);
  if (archive_read_open1(a) != ARCHIVE_OK) {
    return absl::DataLossError(absl::StrCat(path, ": not a tar archive: ", ArchiveError(a)));
  }
  return absl::OkStatus();
}

}  // namespace

bool SplitMemberName(std::string_view name, std::string* key, std::string* extension) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string_view::npos || dot == base || dot + 1 >= name.size()) return false;
  *key = std::string(name.substr(0, dot));
  *extension = std::string(name.substr(dot + 1));
  return true;
}

absl::StatusOr<ShardIndex> IndexShard(const std::string& path, const ShardLimits& limits) {
  ShardIndex index;
  index.path = path;
  ArchivePtr a = NewTarReader();
  OpenFile file;
  if (absl::Status s = OpenAt(path, 0, &file, a.get()); !s.ok()) {
    if (s.code() != absl::StatusCode::kDataLoss) return s;
    index.error = std::string(s.message());
    return index;
  }
  index.error = GroupMembers(a.get(), /*read_data=*/false, limits, &index.broken,
                             [&](int64_t offset, int members, SampleFiles* files) {
                               index.samples.push_back({files->key, offset, members});
                             });
  return index;
}

absl::StatusOr<SampleFiles> ReadSample(const std::string& path, const SampleRef& ref,
                                       const ShardLimits& limits) {
  ArchivePtr a = NewTarReader();
  OpenFile file;
  if (absl::Status s = OpenAt(path, ref.offset, &file, a.get()); !s.ok()) return s;
  SampleFiles out;
  std::string error;
  for (int i = 0; i < ref.members; ++i) {
    Member m;
    bool too_large = false;
    Next next = NextMember(a.get(), /*read_data=*/true, limits, &m, &too_large, &error);
    if (next != Next::kMember) {
      return absl::DataLossError(
          absl::StrCat(path, " @", ref.offset, ": ", next == Next::kEnd ? "archive ended" : error));
    }
    if (m.key != ref.key || too_large) {
      return absl::DataLossError(absl::StrCat(path, " @", ref.offset, ": expected key ", ref.key,
                                              ", found ", m.key, too_large ? " (too large)" : ""));
    }
    out.files[m.extension] = std::move(m.data);
  }
  out.key = ref.key;
  return out;
}

MemoryShard ReadShardFromMemory(std::string_view tar, const ShardLimits& limits) {
  MemoryShard out;
  ArchivePtr a = NewTarReader();
  if (archive_read_open_memory(a.get(), tar.data(), tar.size()) != ARCHIVE_OK) {
    out.error = ArchiveError(a.get());
    return out;
  }
  out.error = GroupMembers(
      a.get(), /*read_data=*/true, limits, &out.broken,
      [&](int64_t, int, SampleFiles* files) { out.samples.push_back(std::move(*files)); });
  return out;
}

namespace {
struct WriteDeleter {
  void operator()(archive* a) const { archive_write_free(a); }
};

la_ssize_t AppendToString(archive*, void* data, const void* buf, size_t n) {
  static_cast<std::string*>(data)->append(static_cast<const char*>(buf), n);
  return static_cast<la_ssize_t>(n);
}
}  // namespace

absl::StatusOr<std::string> TarToMemory(const std::vector<TarMember>& members) {
  std::string out;
  std::unique_ptr<archive, WriteDeleter> a(archive_write_new());
  archive_write_set_format_ustar(a.get());
  archive_write_add_filter_none(a.get());
  archive_write_set_bytes_in_last_block(a.get(), 1);
  if (archive_write_open(a.get(), &out, nullptr, AppendToString, nullptr) != ARCHIVE_OK) {
    return absl::InternalError(absl::StrCat("tar: ", ArchiveError(a.get())));
  }
  for (const TarMember& m : members) {
    std::unique_ptr<archive_entry, void (*)(archive_entry*)> e(archive_entry_new(),
                                                               archive_entry_free);
    archive_entry_set_pathname(e.get(), m.name.c_str());
    archive_entry_set_size(e.get(), static_cast<la_int64_t>(m.bytes.size()));
    archive_entry_set_filetype(e.get(), AE_IFREG);
    archive_entry_set_perm(e.get(), 0644);
    archive_entry_set_mtime(e.get(), 0, 0);
    archive_entry_set_uid(e.get(), 0);
    archive_entry_set_gid(e.get(), 0);
    if (archive_write_header(a.get(), e.get()) != ARCHIVE_OK ||
        archive_write_data(a.get(), m.bytes.data(), m.bytes.size()) !=
            static_cast<la_ssize_t>(m.bytes.size())) {
      return absl::InternalError(absl::StrCat("tar: ", m.name, ": ", ArchiveError(a.get())));
    }
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK) {
    return absl::InternalError(absl::StrCat("tar: ", ArchiveError(a.get())));
  }
  return out;
}

absl::Status WriteTar(const std::string& path, const std::vector<TarMember>& members) {
  absl::StatusOr<std::string> bytes = TarToMemory(members);
  if (!bytes.ok()) return bytes.status();
  return WriteFileAtomically(path, *bytes);
}

}  // namespace loom::data
