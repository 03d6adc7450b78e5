// Transport security of Loom's gRPC servers and clients: mutual TLS with the
// job's certificates, and credentials for the control API.
//
// A job has one certificate authority (ca.crt) and a certificate per
// identity, each in a folder laid out as a Kubernetes TLS Secret (what
// cert-manager writes): ca.crt, tls.crt, tls.key. The identity is the
// certificate's common name: loom-scheduler, loom-preprocess, loom-worker
// (every worker rank), loom-admin (loom up, operators). Every certificate
// names `server_name` ("loom" unless changed) as a DNS subject alternative
// name; clients check that name, not the address they dialled, so one
// certificate serves every pod of an identity. A process presents its own
// certificate as a server and as a client.
//
// What a server lets in (Authorizer), least privilege by identity:
//   grpc.health.v1.Health                 anyone who completes the handshake
//   loom.control.v1.*                     loom-admin's certificate, or a
//                                         bearer token from --control_tokens
//                                         with its role: "read" may GetJob
//                                         and WatchJob, "admin" everything
//   loom.scheduler.v1 (but GetInfo)       loom-worker: register, report,
//                                         assignments, rendezvous keys
//   loom.data.v1 FetchSamples             loom-worker
//   loom.data.v1 GetBatch/GetCursor/Rewind  loom-scheduler
//   every other method (GetInfo, ...)     any certificate of the job's CA
// A client presenting a certificate of another CA fails the handshake. No
// credentials: UNAUTHENTICATED; credentials that do not allow the method
// (a read token writing, a worker rewinding the data): PERMISSION_DENIED
// (gRPC's meanings of the two codes).
//
// Certificates, keys and the token file are read again while serving
// (`refresh`): a rotated Secret takes effect on new connections without a
// restart. --insecure turns all of it off (plaintext, no authentication): an
// explicit choice, never a default.
#ifndef LOOM_SERVICES_COMMON_SECURITY_H_
#define LOOM_SERVICES_COMMON_SECURITY_H_

#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

// The flags (security.cc documents them); launchers set them.
ABSL_DECLARE_FLAG(std::string, tls_dir);
ABSL_DECLARE_FLAG(bool, insecure);
ABSL_DECLARE_FLAG(std::string, tls_server_name);

namespace loom {

struct TransportSecurity {
  // Empty: plaintext without authentication (what --insecure asks for; the
  // default of in-process test fixtures).
  std::string tls_dir;               // ca.crt, tls.crt, tls.key
  std::string server_name = "loom";  // the DNS name servers' certificates carry
  std::string control_tokens;        // server: "ROLE TOKEN" lines; empty: certificates only
  std::string token_file;            // client: a bearer token sent with every call
  absl::Duration refresh = absl::Seconds(10);  // how often files are read again

  bool tls() const { return !tls_dir.empty(); }
  std::string ca_path() const { return tls_dir + "/ca.crt"; }
  std::string cert_path() const { return tls_dir + "/tls.crt"; }
  std::string key_path() const { return tls_dir + "/tls.key"; }
};

// From --tls_dir, --insecure, --tls_server_name, --control_tokens,
// --token_file, --tls_refresh. INVALID_ARGUMENT when neither --tls_dir nor
// --insecure is given, when both are, or when a file named is missing or is
// not what it should be (the error names the flag and the file).
// `need_identity`: tls.crt and tls.key are required (servers; a client with
// only ca.crt and a token may call the control API). `default_tls_dir`
// (a client's): used when neither flag is given and it holds a ca.crt.
absl::StatusOr<TransportSecurity> TransportSecurityFromFlags(
    bool need_identity, const std::string& default_tls_dir = "");

// Checks the files `security` names (see above).
absl::Status ValidateTransportSecurity(const TransportSecurity& security, bool need_identity);

// What ServiceChannel(), CheckHealth() and ControlClient use when given no
// security of their own; plaintext until set. A process sets it once, from
// its flags, before its first call. Thread-safe.
void SetClientSecurity(TransportSecurity security);
TransportSecurity ClientSecurity();

// Server credentials: TLS requesting (and verifying) client certificates,
// with an Authorizer; or insecure ones.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TransportSecurity& security);

// Channel credentials: TLS trusting ca.crt, presenting tls.crt when the
// directory has it, and the bearer token of `token_file` when set; or
// insecure ones. `args` gets the name to check in the server's certificate.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TransportSecurity& security,
                                                                 grpc::ChannelArguments* args);

// A channel to `target` with MakeChannelCredentials(security).
std::shared_ptr<grpc::Channel> SecureChannel(const std::string& target,
                                             const TransportSecurity& security);

// The role a control-API caller holds.
enum class ControlRole { kNone, kRead, kAdmin };

// Parses a token file: one "ROLE TOKEN" per line (ROLE: admin or read;
// TOKEN: 16 to 4096 printable characters), '#' comments, blank lines.
// INVALID_ARGUMENT naming the line.
struct ControlToken {
  ControlRole role;
  std::string token;
};
absl::StatusOr<std::vector<ControlToken>> ParseControlTokens(const std::string& text,
                                                             const std::string& origin);

// The identities of a job's processes, and the folder of each under a
// MakeJobCertificates folder: IdentityDir(dir, kWorkerIdentity) is
// dir + "/worker".
inline constexpr char kSchedulerIdentity[] = "loom-scheduler";
inline constexpr char kPreprocessIdentity[] = "loom-preprocess";
inline constexpr char kWorkerIdentity[] = "loom-worker";
inline constexpr char kAdminIdentity[] = "loom-admin";
std::string IdentityDir(const std::string& dir, const std::string& identity);

// Makes a throwaway job CA and certificates in `dir` with Debian's openssl:
// ca.crt and ca.key, then a folder per identity (IdentityDir) holding
// ca.crt, tls.crt (common name the identity, subject alternative name
// DNS:`server_name`, server and client use, 30 days) and tls.key; and a
// token file `tokens` with one admin and one read token, also written alone
// to admin.token and read.token. Keys are readable by the owner only. For
// local runs and tests.
absl::Status MakeJobCertificates(const std::string& dir, const std::string& server_name = "loom");

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_SECURITY_H_
