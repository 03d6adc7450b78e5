#include "services/common/security.h"

#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "runtime/base/file.h"
#include "runtime/base/log.h"
#include "services/common/subprocess.h"

ABSL_FLAG(std::string, tls_dir, "",
          "Folder with the job's ca.crt, tls.crt and tls.key (a Kubernetes TLS Secret): mutual "
          "TLS on every gRPC server and client. Required unless --insecure.");
ABSL_FLAG(bool, insecure, false,
          "Plaintext gRPC without authentication: anyone who reaches a port may call anything. "
          "Only for debugging on a trusted machine.");
ABSL_FLAG(std::string, tls_server_name, "loom",
          "The DNS name (subject alternative name) the servers' certificate carries; clients "
          "check it.");
ABSL_FLAG(std::string, control_tokens, "",
          "Server: file of control-API bearer tokens, one 'ROLE TOKEN' per line (ROLE: admin "
          "or read), read again when it changes. Empty: only the job's certificate may call "
          "the control API.");
ABSL_FLAG(std::string, token_file, "",
          "Client: file holding a bearer token sent with every call (the control API).");
ABSL_FLAG(absl::Duration, tls_refresh, absl::Seconds(10),
          "How often certificates, keys and the token file are read again.");

namespace loom {
namespace {

constexpr char kControlPrefix[] = "/loom.control.v1.ControlService/";
constexpr char kHealthPrefix[] = "/grpc.health.v1.Health/";
constexpr size_t kMinTokenLength = 16;
constexpr size_t kMaxTokenLength = 4096;

// Methods a read-only caller may use.
bool IsReadMethod(absl::string_view method) { return method == "GetJob" || method == "WatchJob"; }

// The identity a method needs of its caller's certificate; "" when any
// certificate of the job's CA will do.
const char* IdentityFor(absl::string_view path) {
  if (absl::ConsumePrefix(&path, "/loom.scheduler.v1.SchedulerService/")) {
    return path == "GetInfo" ? "" : kWorkerIdentity;
  }
  if (absl::ConsumePrefix(&path, "/loom.data.v1.PreprocessService/")) {
    if (path == "FetchSamples") return kWorkerIdentity;
    if (path == "GetBatch" || path == "GetCursor" || path == "Rewind" || path == "EndJob") {
      return kSchedulerIdentity;
    }
  }
  return "";
}

// Equal without an early exit: the time taken does not tell how much of a
// guess matched.
bool SameToken(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::Status CheckPem(const std::string& path, const char* marker, const char* flag,
                      const char* what) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read ", what, " ", path, ": ", text.status().message()));
  }
  if (!absl::StrContains(*text, marker)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is not a PEM ", what, " (no '", marker, "')"));
  }
  return absl::OkStatus();
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token_file: cannot read ", path, ": ", text.status().message()));
  }
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.size() < kMinTokenLength || token.size() > kMaxTokenLength ||
      token.find_first_of(" \t\r\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token_file: ", path, " must hold one token of ", kMinTokenLength, " to ",
                     kMaxTokenLength, " printable characters"));
  }
  return token;
}

// Decides every call to a TLS server: see the header's table.
class Authorizer final : public grpc::AuthMetadataProcessor {
 public:
  Authorizer(std::string tokens_path, absl::Duration refresh)
      : tokens_path_(std::move(tokens_path)), refresh_(refresh) {
    absl::MutexLock lock(&mu_);
    Reload();
  }

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata* /*response*/) override {
    absl::string_view path;
    absl::string_view authorization;
    for (const auto& [key, value] : metadata) {
      absl::string_view k(key.data(), key.size());
      if (k == ":path") path = absl::string_view(value.data(), value.size());
      if (k == "authorization") authorization = absl::string_view(value.data(), value.size());
    }
    if (!authorization.empty()) consumed->emplace("authorization", std::string(authorization));
    if (absl::StartsWith(path, kHealthPrefix)) return grpc::Status::OK;
    // A verified certificate of the job's CA, and its identity.
    const bool job_certificate = context->IsPeerAuthenticated();
    std::string identity;
    if (job_certificate) {
      std::vector<grpc::string_ref> cn = context->FindPropertyValues("x509_common_name");
      if (!cn.empty()) identity.assign(cn.front().data(), cn.front().size());
    }
    if (!absl::StartsWith(path, kControlPrefix)) {
      if (!job_certificate) {
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                            absl::StrCat(path, " needs a certificate of the job"));
      }
      const std::string need = IdentityFor(path);
      if (!need.empty() && identity != need) {
        return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                            absl::StrCat(path, " is for ", need, ", not ", identity));
      }
      return grpc::Status::OK;
    }
    ControlRole role = ControlRole::kNone;
    if (!authorization.empty()) {
      if (!absl::ConsumePrefix(&authorization, "Bearer ")) {
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                            "authorization metadata is not 'Bearer TOKEN'");
      }
      role = RoleOf(authorization);
      if (role == ControlRole::kNone) {
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown bearer token");
      }
    } else if (identity == kAdminIdentity) {
      role = ControlRole::kAdmin;
    } else if (job_certificate) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("the control API takes ", kAdminIdentity,
                                       "'s certificate or a bearer token, not ", identity, "'s"));
    } else {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "the control API needs credentials: a bearer token (loomctl "
                          "--token_file) or the admin certificate");
    }
    absl::string_view method = path.substr(sizeof(kControlPrefix) - 1);
    if (role == ControlRole::kRead && !IsReadMethod(method)) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("a read-only token may not call ", method));
    }
    return grpc::Status::OK;
  }

 private:
  ControlRole RoleOf(absl::string_view token) {
    absl::MutexLock lock(&mu_);
    if (absl::Now() - last_check_ >= refresh_) Reload();
    ControlRole role = ControlRole::kNone;
    for (const ControlToken& t : tokens_) {
      if (SameToken(t.token, token)) role = t.role;
    }
    return role;
  }

  // Reads the token file again if it changed; a file that no longer parses
  // is logged and the tokens read before stay.
  void Reload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    last_check_ = absl::Now();
    if (tokens_path_.empty()) return;
    struct stat st;
    if (stat(tokens_path_.c_str(), &st) != 0) {
      LOOM_LOG(ERROR).With("file", tokens_path_) << "control tokens: cannot stat; keeping the last";
      return;
    }
    const auto stamp =
        std::make_tuple(st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_size, st.st_ino);
    if (loaded_ && stamp == stamp_) return;
    absl::StatusOr<std::string> text = ReadFile(tokens_path_);
    absl::StatusOr<std::vector<ControlToken>> tokens =
        text.ok() ? ParseControlTokens(*text, tokens_path_) : text.status();
    if (!tokens.ok()) {
      LOOM_LOG(ERROR).With("file", tokens_path_)
          << "control tokens not reloaded: " << tokens.status().message();
      return;
    }
    tokens_ = *std::move(tokens);
    stamp_ = stamp;
    if (loaded_) LOOM_LOG(INFO).With("tokens", tokens_.size()) << "control tokens reloaded";
    loaded_ = true;
  }

  const std::string tokens_path_;
  const absl::Duration refresh_;
  absl::Mutex mu_;
  std::vector<ControlToken> tokens_ ABSL_GUARDED_BY(mu_);
  std::tuple<int64_t, int64_t, int64_t, uint64_t> stamp_ ABSL_GUARDED_BY(mu_);
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_check_ ABSL_GUARDED_BY(mu_);
};

unsigned RefreshSeconds(const TransportSecurity& s) {
  return static_cast<unsigned>(std::max<int64_t>(1, absl::ToInt64Seconds(s.refresh)));
}

absl::Mutex client_mu(absl::kConstInit);
TransportSecurity* client_security ABSL_GUARDED_BY(client_mu) = nullptr;

}  // namespace

absl::Status ValidateTransportSecurity(const TransportSecurity& s, bool need_identity) {
  if (!s.tls()) return absl::OkStatus();
  if (s.server_name.empty()) return absl::InvalidArgumentError("--tls_server_name is empty");
  if (s.refresh < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--tls_refresh must be at least 1s");
  }
  if (absl::Status st = CheckPem(s.ca_path(), "BEGIN CERTIFICATE", "--tls_dir", "CA certificate");
      !st.ok()) {
    return st;
  }
  if (need_identity || Exists(s.cert_path()) || Exists(s.key_path())) {
    if (absl::Status st = CheckPem(s.cert_path(), "BEGIN CERTIFICATE", "--tls_dir", "certificate");
        !st.ok()) {
      return st;
    }
    if (absl::Status st = CheckPem(s.key_path(), "PRIVATE KEY-----", "--tls_dir", "private key");
        !st.ok()) {
      return st;
    }
  }
  if (!s.control_tokens.empty()) {
    absl::StatusOr<std::string> text = ReadFile(s.control_tokens);
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--control_tokens: cannot read ", s.control_tokens, ": ", text.status().message()));
    }
    absl::StatusOr<std::vector<ControlToken>> tokens = ParseControlTokens(*text, s.control_tokens);
    if (!tokens.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--control_tokens: ", tokens.status().message()));
    }
  }
  if (!s.token_file.empty()) {
    if (absl::StatusOr<std::string> t = ReadToken(s.token_file); !t.ok()) return t.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<TransportSecurity> TransportSecurityFromFlags(bool need_identity,
                                                             const std::string& default_tls_dir) {
  TransportSecurity s;
  s.tls_dir = absl::GetFlag(FLAGS_tls_dir);
  s.server_name = absl::GetFlag(FLAGS_tls_server_name);
  s.control_tokens = absl::GetFlag(FLAGS_control_tokens);
  s.token_file = absl::GetFlag(FLAGS_token_file);
  s.refresh = absl::GetFlag(FLAGS_tls_refresh);
  const bool insecure = absl::GetFlag(FLAGS_insecure);
  if (s.tls_dir.empty() && !insecure && !default_tls_dir.empty() &&
      Exists(default_tls_dir + "/ca.crt")) {
    s.tls_dir = default_tls_dir;
  }
  if (s.tls_dir.empty() && !insecure) {
    return absl::InvalidArgumentError(
        "--tls_dir (the folder with the job's ca.crt, tls.crt, tls.key) is required; "
        "--insecure runs without TLS or authentication");
  }
  if (!s.tls_dir.empty() && insecure) {
    return absl::InvalidArgumentError("--tls_dir and --insecure exclude each other");
  }
  if (insecure && (!s.control_tokens.empty() || !s.token_file.empty())) {
    return absl::InvalidArgumentError(
        "--control_tokens and --token_file need TLS (a token sent in plaintext is given away)");
  }
  if (absl::Status st = ValidateTransportSecurity(s, need_identity); !st.ok()) return st;
  return s;
}

void SetClientSecurity(TransportSecurity security) {
  absl::MutexLock lock(&client_mu);
  delete client_security;
  client_security = new TransportSecurity(std::move(security));
}

TransportSecurity ClientSecurity() {
  absl::MutexLock lock(&client_mu);
  return client_security != nullptr ? *client_security : TransportSecurity();
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TransportSecurity& s) {
  if (!s.tls()) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      s.key_path(), s.cert_path(), s.ca_path(), RefreshSeconds(s));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  // Requested and verified when presented: a certificate of another CA
  // fails the handshake; none at all reaches the Authorizer, which lets
  // such a caller only into health checks and, with a token, the control API.
  options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  std::shared_ptr<grpc::ServerCredentials> creds =
      grpc::experimental::TlsServerCredentials(options);
  creds->SetAuthMetadataProcessor(std::make_shared<Authorizer>(s.control_tokens, s.refresh));
  return creds;
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TransportSecurity& s,
                                                                 grpc::ChannelArguments* args) {
  if (!s.tls()) return grpc::InsecureChannelCredentials();
  args->SetSslTargetNameOverride(s.server_name);
  // One set of credentials (and one file watcher thread) per distinct
  // security in the process: a benchmark opens thousands of channels.
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache = new std::map<std::tuple<std::string, std::string, int64_t>,
                                    std::shared_ptr<grpc::ChannelCredentials>>();
  const auto key = std::make_tuple(s.tls_dir, s.token_file, absl::ToInt64Seconds(s.refresh));
  absl::MutexLock lock(&mu);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  const bool identity = Exists(s.cert_path()) && Exists(s.key_path());
  auto provider = identity ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                                 s.key_path(), s.cert_path(), s.ca_path(), RefreshSeconds(s))
                           : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                                 s.ca_path(), RefreshSeconds(s));
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (identity) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::experimental::TlsCredentials(options);
  if (!s.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadToken(s.token_file);
    if (!token.ok()) {
      // Validated at start-up; a token that went away since sends none, and
      // the server answers UNAUTHENTICATED.
      LOOM_LOG(ERROR) << token.status().message();
    } else {
      creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(*token));
    }
  }
  cache->emplace(key, creds);
  return creds;
}

std::shared_ptr<grpc::Channel> SecureChannel(const std::string& target,
                                             const TransportSecurity& security) {
  grpc::ChannelArguments args;
  std::shared_ptr<grpc::ChannelCredentials> creds = MakeChannelCredentials(security, &args);
  return grpc::CreateCustomChannel(target, creds, args);
}

absl::StatusOr<std::vector<ControlToken>> ParseControlTokens(const std::string& text,
                                                             const std::string& origin) {
  std::vector<ControlToken> tokens;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat(origin, ":", line_no, ": ");
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "want 'ROLE TOKEN', got ", fields.size(), " fields"));
    }
    ControlToken t;
    if (fields[0] == "admin") {
      t.role = ControlRole::kAdmin;
    } else if (fields[0] == "read") {
      t.role = ControlRole::kRead;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "role '", fields[0], "' is neither admin nor read"));
    }
    if (fields[1].size() < kMinTokenLength || fields[1].size() > kMaxTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat(where, "a token has ", kMinTokenLength, " to ",
                                                     kMaxTokenLength, " characters, got ",
                                                     fields[1].size()));
    }
    for (char c : fields[1]) {
      if (c < 0x21 || c > 0x7e) {
        return absl::InvalidArgumentError(absl::StrCat(where, "a token is printable ASCII"));
      }
    }
    t.token = std::string(fields[1]);
    tokens.push_back(std::move(t));
  }
  return tokens;
}

namespace {

absl::Status RunOpenssl(const std::vector<std::string>& args, const std::string& dir) {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string log = dir + "/openssl.log";
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(argv, log);
  if (!p.ok()) return p.status();
  absl::StatusOr<int> status = (*p)->Wait(absl::Seconds(60));
  if (!status.ok()) return status.status();
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(absl::StrCat("openssl ", args.front(), " ",
                                            DescribeWaitStatus(*status), ": ", (*p)->ReadLog()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RandomToken() {
  unsigned char bytes[32];
  if (getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
  }
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : bytes) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

}  // namespace

std::string IdentityDir(const std::string& dir, const std::string& identity) {
  absl::string_view name = identity;
  absl::ConsumePrefix(&name, "loom-");
  return absl::StrCat(dir, "/", name);
}

absl::Status MakeJobCertificates(const std::string& dir, const std::string& server_name) {
  if (absl::Status s = MakeDirectories(dir); !s.ok()) return s;
  if (chmod(dir.c_str(), 0700) != 0) {  // keys and tokens: the owner only
    return absl::InternalError(absl::StrCat("cannot chmod ", dir, ": ", std::strerror(errno)));
  }
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                       "-nodes"};
  std::vector<std::string> ca = {"req", "-x509"};
  ca.insert(ca.end(), ec.begin(), ec.end());
  ca.insert(ca.end(), {"-keyout", dir + "/ca.key", "-out", dir + "/ca.crt", "-days", "30", "-subj",
                       "/CN=Loom job CA", "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
                       "keyUsage=critical,keyCertSign,cRLSign"});
  if (absl::Status s = RunOpenssl(ca, dir); !s.ok()) return s;
  absl::StatusOr<std::string> ca_pem = ReadFile(dir + "/ca.crt");
  if (!ca_pem.ok()) return ca_pem.status();
  const std::string ext = dir + "/tls.ext";
  if (absl::Status s = WriteFileAtomically(
          ext, absl::StrCat("subjectAltName=DNS:", server_name,
                            "\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n"
                            "keyUsage=critical,digitalSignature,keyEncipherment\n"));
      !s.ok()) {
    return s;
  }
  for (const char* identity :
       {kSchedulerIdentity, kPreprocessIdentity, kWorkerIdentity, kAdminIdentity}) {
    const std::string out = IdentityDir(dir, identity);
    if (absl::Status s = MakeDirectories(out); !s.ok()) return s;
    std::vector<std::string> csr = {"req"};
    csr.insert(csr.end(), ec.begin(), ec.end());
    csr.insert(csr.end(), {"-keyout", out + "/tls.key", "-out", out + "/tls.csr", "-subj",
                           absl::StrCat("/CN=", identity)});
    if (absl::Status s = RunOpenssl(csr, dir); !s.ok()) return s;
    if (absl::Status s = RunOpenssl({"x509", "-req", "-in", out + "/tls.csr", "-CA",
                                     dir + "/ca.crt", "-CAkey", dir + "/ca.key", "-CAcreateserial",
                                     "-out", out + "/tls.crt", "-days", "30", "-extfile", ext},
                                    dir);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = WriteFileAtomically(out + "/ca.crt", *ca_pem); !s.ok()) return s;
    if (chmod((out + "/tls.key").c_str(), 0600) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot chmod ", out, "/tls.key: ", std::strerror(errno)));
    }
  }
  absl::StatusOr<std::string> admin = RandomToken();
  absl::StatusOr<std::string> read = RandomToken();
  if (!admin.ok()) return admin.status();
  if (!read.ok()) return read.status();
  const std::pair<std::string, std::string> files[] = {
      {"tokens", absl::StrCat("# role token (loom-scheduler --control_tokens)\nadmin ", *admin,
                              "\nread ", *read, "\n")},
      {"admin.token", *admin + "\n"},
      {"read.token", *read + "\n"}};
  for (const auto& [name, text] : files) {
    if (absl::Status s = WriteFileAtomically(dir + "/" + name, text); !s.ok()) return s;
  }
  for (const char* name : {"ca.key", "tokens", "admin.token", "read.token"}) {
    if (chmod((dir + "/" + name).c_str(), 0600) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot chmod ", dir, "/", name, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom
