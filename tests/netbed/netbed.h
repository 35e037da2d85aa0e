// The C++ side of the network test bed (tests/netbed/netbed.sh): hosts made
// of network namespaces on one machine, joined by a bridge in a switch
// namespace, with addresses 10.77.0.<I+1>. Each test builds its own bed,
// starts daemons in its hosts (Exec), cuts, heals and caps their links,
// and tears everything down in the destructor, also when the test fails.
//
// Needs root (ip netns, veth, bridge, tbf). Where the process is not root
// the tests skip, saying so; as root a bed that cannot be built is a test
// failure, so CI cannot silently skip them.
//
// Thread-compatible.
#ifndef LOCKSTEP_TESTS_NETBED_NETBED_H_
#define LOCKSTEP_TESTS_NETBED_NETBED_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lockstep::netbed {

// Every bed's namespaces are named kPrefix-<name>-{sw,h0,h1,...}.
inline constexpr char kPrefix[] = "lsnb";

// Why this process cannot build beds (not root, no `ip`), or "" when it can.
std::string WhyUnavailable();

// The namespaces and root-namespace veths a bed left behind (an earlier run
// that was killed), one per line; "" when there are none.
std::string Leftovers();
// Tears down every bed that Leftovers() names.
void RemoveLeftovers();

class Bed {
 public:
  // Builds bed `name` (letters and digits) of `hosts` hosts. Errors:
  // Internal naming the step that failed (the script's message).
  static absl::StatusOr<std::unique_ptr<Bed>> Up(const std::string& name,
                                                 int hosts);
  // Kills every process left in the bed's namespaces and deletes them.
  ~Bed();
  Bed(const Bed&) = delete;
  Bed& operator=(const Bed&) = delete;

  int hosts() const { return hosts_; }
  // Host `host`'s address ("10.77.0.2" for host 1) and namespace.
  std::string Address(int host) const;
  std::string Namespace(int host) const;
  // `argv` run in host `host`: `ip netns exec NS argv...`, which execs argv
  // in place (the pid a spawner gets is the program's).
  std::vector<std::string> Exec(int host,
                                const std::vector<std::string>& argv) const;

  // The host's cable pulled at the switch (its port down), and plugged
  // back; its processes live on.
  absl::Status Cut(int host);
  absl::Status Heal(int host);
  // Both directions of the host's link capped to `rate` (tc's syntax:
  // "200mbit"), and uncapped.
  absl::Status Cap(int host, const std::string& rate);
  absl::Status Uncap(int host);

 private:
  Bed(std::string prefix, int hosts)
      : prefix_(std::move(prefix)), hosts_(hosts) {}

  const std::string prefix_;
  const int hosts_;
};

}  // namespace lockstep::netbed

#endif  // LOCKSTEP_TESTS_NETBED_NETBED_H_
