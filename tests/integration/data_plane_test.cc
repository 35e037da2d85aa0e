// The data plane against a stranger (docs/DESIGN.md, "Data-plane
// membership"): a process that is not a member connects to the ranks' Gloo
// ports during a rendezvous, first. The generation fails within seconds with
// an event naming the stranger's address, and the retried generation trains
// the job to success.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// A TCP client that connects to 127.0.0.1:`port` and keeps the connection
// open, silent, until destroyed: the test destroys it only once the ranks'
// generation-1 listeners are gone, since a connection reset while it waits
// in a Gloo listener's queue would kill the worker when Gloo accepts it.
class Stranger {
 public:
  explicit Stranger(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0)
        << "port " << port;
    sockaddr_in local{};
    socklen_t size = sizeof(local);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &size);
    local_ = absl::StrCat("127.0.0.1:", ntohs(local.sin_port));
  }
  ~Stranger() { close(fd_); }
  const std::string& local() const { return local_; }

 private:
  int fd_ = -1;
  std::string local_;
};

class DataPlaneTest : public ClusterTest {
 protected:
  // The port worker `index` listens on for its peer, from the line the
  // failure point gloo_hold_rendezvous logs while the rank holds. Waits for
  // the line (the rank's rendezvous), at most a minute.
  int HeldPort(int index) {
    const std::regex held(
        "gloo_hold_rendezvous.*published its Gloo ports \\(rank \\d+ at "
        "127\\.0\\.0\\.1:(\\d+)\\)");
    const std::string log =
        absl::StrCat(dir_, "/worker-", index, "-", index + 1, ".log");
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(log);
      std::stringstream text;
      text << in.rdbuf();
      std::smatch match;
      const std::string all = text.str();
      if (std::regex_search(all, match, held)) return std::stoi(match[1]);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "worker " << index << " never held in its rendezvous; "
                  << log;
    return -1;
  }
};

TEST_F(DataPlaneTest, AStrangerOnTheGlooPortsIsNamedAndTheRetryTrains) {
  const std::string release = TempDir("gloo_release") + "/go";
  const std::vector<std::string> hold = {
      "LOCKSTEP_FAILPOINT=gloo_hold_rendezvous",
      "LOCKSTEP_FAILPOINT_RELEASE=" + release};
  StartCluster(2, {}, {{0, hold}, {1, hold}});
  const std::string job = Submit({"max_steps=20", "max_restarts=2"});
  // Both ranks of generation 1 published their ports and wait; a stranger
  // connects to each, then the ranks go on. (Generation 2 does not hold:
  // the failure point fires once per process.)
  std::vector<std::unique_ptr<Stranger>> strangers;
  for (int index : {0, 1}) {
    const int port = HeldPort(index);
    ASSERT_GT(port, 0);
    strangers.push_back(std::make_unique<Stranger>(port));
  }
  std::ofstream(release) << "go\n";

  v1::JobStatus done = WatchUntil(job, Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << History(job);
  EXPECT_EQ(done.generations(), 2) << History(job);
  const v1::JobEvent* failed = FindEvent(done, "generation_failed");
  ASSERT_NE(failed, nullptr) << History(job);
  EXPECT_EQ(failed->generation(), 1);
  EXPECT_THAT(failed->message(), AnyOf(HasSubstr(strangers[0]->local()),
                                       HasSubstr(strangers[1]->local())))
      << History(job);
  EXPECT_THAT(failed->message(),
              HasSubstr("not a member of generation 1 of job " + job));
  strangers.clear();  // generation 1's listeners closed long ago
}

}  // namespace
}  // namespace lockstep::integration
