#include "tests/integration/netns.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace loom {

std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "ip";
}

absl::Status Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {IpBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  int rc = -1;
  const std::string out = RunToEnd(argv, "ip.log", &rc);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), ": exit ", rc, ": ", out));
  }
  return absl::OkStatus();
}

void TwoHostsTest::SetUp() {
  const std::string id = absl::StrCat(getpid());
  host_a_ = "loom-a-" + id;
  host_b_ = "loom-b-" + id;
  link_a_ = "lma" + id;  // interface names: 15 characters at most
  link_b_ = "lmb" + id;
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"netns", "add", host_a_},
           {"netns", "add", host_b_},
           {"link", "add", link_a_, "type", "veth", "peer", "name", link_b_},
           {"link", "set", link_a_, "netns", host_a_},
           {"link", "set", link_b_, "netns", host_b_},
           {"-n", host_a_, "addr", "add", std::string(kAddressA) + "/24", "dev", link_a_},
           {"-n", host_b_, "addr", "add", std::string(kAddressB) + "/24", "dev", link_b_},
           {"-n", host_a_, "link", "set", "lo", "up"},
           {"-n", host_b_, "link", "set", "lo", "up"},
           {"-n", host_a_, "link", "set", link_a_, "up"},
           {"-n", host_b_, "link", "set", link_b_, "up"},
       }) {
    absl::Status s = Ip(args);
    ASSERT_TRUE(s.ok()) << s << "\n(this test makes two network namespaces joined by a veth "
                        << "pair: it needs root, or CAP_NET_ADMIN and CAP_SYS_ADMIN)";
  }
}

void TwoHostsTest::TearDown() {
  (void)Ip({"netns", "del", host_a_});  // its end of the veth pair goes with it
  (void)Ip({"netns", "del", host_b_});
}

}  // namespace loom
