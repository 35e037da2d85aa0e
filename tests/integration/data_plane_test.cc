// The data plane against strangers (docs/DESIGN.md, "Data-plane
// transport"): while both ranks of a generation hold in their rendezvous,
// processes that are not members connect to their data-plane ports: one
// sends the 48-byte Gloo header that killed workers over Gloo's pairs, one
// sends garbage, one stays silent, and forty connect and close at once. Each
// is refused and named in the rank's log, no worker dies, and the same
// generation trains the job to success.
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

using ::testing::HasSubstr;
using ::testing::Not;

// A TCP client of 127.0.0.1:`port` that sends `bytes` and keeps the
// connection open until destroyed.
class Stranger {
 public:
  Stranger(int port, const std::string& bytes) {
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
    if (!bytes.empty()) {
      EXPECT_EQ(send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
                static_cast<ssize_t>(bytes.size()));
    }
  }
  ~Stranger() { close(fd_); }
  const std::string& local() const { return local_; }

 private:
  int fd_ = -1;
  std::string local_;
};

class DataPlaneTest : public ClusterTest {
 protected:
  std::string Log(int index) {
    return absl::StrCat(dir_, "/worker-", index, "-", index + 1, ".log");
  }
  std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // The port worker `index` listens on for its peers, from the line the
  // failure point data_plane_hold_rendezvous logs while the rank holds.
  // Waits for the line (the rank's rendezvous), at most a minute.
  int HeldPort(int index) {
    const std::regex held(
        "data_plane_hold_rendezvous.*published its data-plane address "
        "\\(rank \\d+ at 127\\.0\\.0\\.1:(\\d+)\\)");
    const std::string log = Log(index);
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

TEST_F(DataPlaneTest, StrangersOnTheDataPlanePortsAreRefusedAndTheJobTrains) {
  const std::string release = TempDir("data_plane_release") + "/go";
  const std::vector<std::string> hold = {
      "LOCKSTEP_FAILPOINT=data_plane_hold_rendezvous",
      "LOCKSTEP_FAILPOINT_RELEASE=" + release};
  StartCluster(2, {}, {{0, hold}, {1, hold}});
  const std::string job = Submit({"max_steps=20", "max_restarts=0"});
  // struct.pack("<6Q", 1<<62, 1, 0x41<<56, 0, 1<<62, 0): one Gloo header.
  const uint64_t gloo_header[6] = {
      uint64_t{1} << 62, 1, uint64_t{0x41} << 56, 0, uint64_t{1} << 62, 0};
  const std::string packet(reinterpret_cast<const char*>(gloo_header), 48);
  std::vector<std::unique_ptr<Stranger>> named;
  for (int index : {0, 1}) {
    const int port = HeldPort(index);
    ASSERT_GT(port, 0);
    named.push_back(std::make_unique<Stranger>(port, packet));
    named.push_back(std::make_unique<Stranger>(port, std::string(200, 'x')));
    named.push_back(std::make_unique<Stranger>(port, ""));  // silent
    for (int i = 0; i < 40; ++i) Stranger bare(port, "");   // connect, close
  }
  std::ofstream(release) << "go\n";

  v1::JobStatus done = WatchUntil(job, Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << History(job);
  EXPECT_EQ(done.generations(), 1) << History(job);
  EXPECT_EQ(FindEvent(done, "generation_failed"), nullptr) << History(job);
  // Rank 0 accepts its peers, so it read and refused the Gloo header and
  // the garbage, naming their real addresses (ports in host order). Rank 1
  // accepts no one (it calls rank 0): its strangers were never read, and
  // were cut off when it closed its port.
  const std::string log = Read(Log(0));
  for (int stranger : {0, 1}) {
    EXPECT_THAT(log, HasSubstr("refused a data-plane connection from " +
                               named[stranger]->local() +
                               ": it does not speak lockstep's data-plane "
                               "protocol"))
        << log;
  }
  for (int index : {0, 1}) {
    EXPECT_THAT(Read(Log(index)), Not(HasSubstr("terminate called")));
  }
  named.clear();
}

}  // namespace
}  // namespace lockstep::integration
