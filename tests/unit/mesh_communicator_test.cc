// lockstep's data-plane transport over real TCP sockets on 127.0.0.1, ranks
// as threads meeting through an in-memory key-value store; strangers,
// replays, a man in the middle and a proxy that reads the wire are played
// by the test itself.
#include "worker/collective/mesh_communicator.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "tests/unit/status_value.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/half.h"
#include "worker/collective/in_memory_kv.h"

namespace lockstep::worker {
namespace {

using ::testing::HasSubstr;
using Algorithm = AllReduceAlgorithm;

// Rank `rank`'s membership of a `world`-rank generation, with pair keys as
// the coordinator hands them out.
Membership TestMembership(int rank, int world) {
  return FixedKeysForTesting("job-1", 3, rank, world);
}

MeshCommunicator::Options RankOptions(
    int rank, int world, bool encrypted,
    Algorithm algorithm = Algorithm::kDirect) {
  MeshCommunicator::Options options;
  options.rank = rank;
  options.size = world;
  options.timeout = absl::Seconds(30);
  options.algorithm = algorithm;
  options.membership = TestMembership(rank, world);
  options.encrypted = encrypted;
  return options;
}

// Runs `body` on `world` ranks of `options_of`'s communicators and joins.
// `meanwhile`, if set, runs on the calling thread while the ranks do.
void OnMesh(int world, KeyValueClient* kv,
            const std::function<MeshCommunicator::Options(int)>& options_of,
            const std::function<void(int, absl::StatusOr<Communicator*>)>& body,
            const std::function<void()>& meanwhile = nullptr) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto comm = MeshCommunicator::Connect(kv, options_of(rank));
      if (!comm.ok()) {
        body(rank, comm.status());
        return;
      }
      body(rank, comm->get());
    });
  }
  if (meanwhile) meanwhile();
  for (std::thread& t : threads) t.join();
}

// A connected TCP socket to "host:port" (the test's stranger).
int ConnectTo(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(colon + 1), &port));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  return fd;
}

struct Case {
  int world;
  size_t count;
  Algorithm algorithm;
  bool encrypted;
};

class MeshAllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(MeshAllReduceTest, SumsBroadcastsAndGathersOnEveryRank) {
  const Case c = GetParam();
  InMemoryKeyValue kv;
  std::vector<std::vector<float>> sums(c.world), broadcasts(c.world);
  std::vector<std::vector<int>> gathered(c.world);
  std::vector<absl::Status> errors(c.world);
  OnMesh(
      c.world, &kv,
      [&](int rank) {
        return RankOptions(rank, c.world, c.encrypted, c.algorithm);
      },
      [&](int rank, absl::StatusOr<Communicator*> comm) {
        if (!comm.ok()) {
          errors[rank] = comm.status();
          return;
        }
        std::vector<float>& data = sums[rank];
        for (size_t i = 0; i < c.count; ++i) {
          data.push_back(float(rank + 1) * (i % 97));
        }
        errors[rank] = (*comm)->AllReduceSum(data.data(), data.size());
        if (!errors[rank].ok()) return;
        broadcasts[rank].assign(c.count, float(rank));
        errors[rank] =
            (*comm)->Broadcast(broadcasts[rank].data(), c.count, c.world - 1);
        if (!errors[rank].ok()) return;
        gathered[rank].resize(c.world);
        const int mine = rank * 10;
        errors[rank] =
            (*comm)->AllGather(&mine, sizeof(int), gathered[rank].data());
      });
  const float factor = c.world * (c.world + 1) / 2.0f;
  for (int rank = 0; rank < c.world; ++rank) {
    ASSERT_TRUE(errors[rank].ok()) << errors[rank];
    for (size_t i = 0; i < c.count; ++i) {
      ASSERT_EQ(sums[rank][i], factor * (i % 97)) << rank << " " << i;
      ASSERT_EQ(broadcasts[rank][i], float(c.world - 1));
    }
    for (int r = 0; r < c.world; ++r) EXPECT_EQ(gathered[rank][r], r * 10);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, MeshAllReduceTest,
    ::testing::Values(Case{2, 0, Algorithm::kDirect, true},
                      Case{2, 1, Algorithm::kDirect, true},
                      Case{2, 1001, Algorithm::kDirect, false},
                      Case{3, 7, Algorithm::kDirect, true},
                      Case{3, 1 << 20, Algorithm::kDirect, true},
                      Case{4, 262147, Algorithm::kDirect, false},
                      Case{4, 3, Algorithm::kDirect, true},
                      Case{2, 1, Algorithm::kRing, true},
                      Case{3, 2, Algorithm::kRing, false},
                      Case{3, 1 << 20, Algorithm::kRing, true},
                      Case{4, 262147, Algorithm::kRing, true}),
    [](const auto& info) {
      return absl::StrCat(
          info.param.algorithm == Algorithm::kRing ? "Ring" : "Direct", "_W",
          info.param.world, "_N", info.param.count,
          info.param.encrypted ? "_Encrypted" : "_Clear");
    });

// The same inputs through Gloo's pairs and through lockstep's transport give
// the same bits: the algorithms and their rank-order sums did not change
// with the transport (what keeps the reference digests).
TEST(MeshCommunicatorTest, SameBitsAsTheGlooTransport) {
  constexpr int kWorld = 3;
  constexpr size_t kCount = 100003;
  std::vector<std::vector<float>> inputs(kWorld);
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0, 1);
  for (auto& input : inputs) {
    for (size_t i = 0; i < kCount; ++i) input.push_back(normal(random));
  }
  for (Algorithm algorithm : {Algorithm::kDirect, Algorithm::kRing}) {
    for (DataType type : {DataType::kFloat32, DataType::kBFloat16}) {
      auto bytes_of = [&](int rank) {
        std::vector<uint16_t> half;
        for (float x : inputs[rank]) half.push_back(FloatToBFloat16(x));
        std::string out;
        if (type == DataType::kFloat32) {
          out.assign(reinterpret_cast<const char*>(inputs[rank].data()),
                     kCount * 4);
        } else {
          out.assign(reinterpret_cast<const char*>(half.data()), kCount * 2);
        }
        return out;
      };
      std::vector<std::string> mesh(kWorld), gloo(kWorld);
      InMemoryKeyValue mesh_kv, gloo_kv;
      std::vector<std::thread> threads;
      for (int rank = 0; rank < kWorld; ++rank) {
        threads.emplace_back([&, rank] {
          mesh[rank] = bytes_of(rank);
          auto comm = MeshCommunicator::Connect(
              &mesh_kv, RankOptions(rank, kWorld, true, algorithm));
          ASSERT_TRUE(comm.ok()) << comm.status();
          ASSERT_TRUE(
              (*comm)->AllReduceSum(mesh[rank].data(), kCount, type).ok());
        });
        threads.emplace_back([&, rank] {
          gloo[rank] = bytes_of(rank);
          GlooCommunicator::Options options;
          options.rank = rank;
          options.size = kWorld;
          options.algorithm = algorithm;
          auto comm = GlooCommunicator::Connect(&gloo_kv, options);
          ASSERT_TRUE(comm.ok()) << comm.status();
          ASSERT_TRUE(
              (*comm)->AllReduceSum(gloo[rank].data(), kCount, type).ok());
        });
      }
      for (std::thread& t : threads) t.join();
      for (int rank = 0; rank < kWorld; ++rank) {
        EXPECT_TRUE(mesh[rank] == gloo[rank]) << "rank " << rank;
        EXPECT_TRUE(mesh[rank] == mesh[0]) << "rank " << rank;
      }
    }
  }
}

// Only rank 0 of 2 shows up, so the rendezvous timeout is certain.
TEST(MeshCommunicatorTest, AMissingPeerIsNamedWithinTheTimeout) {
  InMemoryKeyValue kv;
  auto options = RankOptions(0, 2, true);
  options.timeout = absl::Milliseconds(300);
  auto comm = MeshCommunicator::Connect(&kv, options);
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
  EXPECT_THAT(comm.status().message(), HasSubstr("for rank(s) 1 to connect"));
}

// The peer never comes and the timeout is an hour: only Abort() ends the
// wait, wherever rank 0 is in it.
TEST(MeshCommunicatorTest, AbortReleasesTheRendezvousAndAPendingAllReduce) {
  InMemoryKeyValue kv;
  auto options = RankOptions(0, 2, true);
  options.timeout = absl::Hours(1);
  auto comm = MeshCommunicator::Create(options);
  ASSERT_TRUE(comm.ok());
  absl::Status result;
  std::thread connecting([&] { result = (*comm)->Connect(&kv); });
  ASSERT_TRUE(kv.Get("0", absl::Minutes(1)).ok());  // listening, waiting
  (*comm)->Abort();
  connecting.join();
  EXPECT_TRUE(absl::IsAborted(result)) << result;

  // Rank 1 connects and then never calls the all-reduce.
  InMemoryKeyValue kv2;
  absl::Notification hung, done;
  std::unique_ptr<MeshCommunicator> zero;
  absl::Notification zero_ready;
  absl::Status all_reduce;
  std::thread peer([&] {
    auto one = MeshCommunicator::Connect(&kv2, RankOptions(1, 2, true));
    ASSERT_TRUE(one.ok());
    done.WaitForNotification();
  });
  std::thread waiting([&] {
    auto options = RankOptions(0, 2, true);
    options.timeout = absl::Hours(1);
    auto connected = MeshCommunicator::Connect(&kv2, options);
    ASSERT_TRUE(connected.ok());
    zero = *std::move(connected);
    zero_ready.Notify();
    std::vector<float> data(1000, 1.0f);
    all_reduce = zero->AllReduceSum(data.data(), data.size());
  });
  zero_ready.WaitForNotification();
  zero->Abort();
  waiting.join();
  done.Notify();
  peer.join();
  EXPECT_TRUE(absl::IsAborted(all_reduce)) << all_reduce;
}

// Rank 2 of 3 connects, then leaves without joining the all-reduce: the
// others fail, each naming a peer with its address. The first to notice can
// only have seen rank 2 go; the other may instead see that first one close
// its connections, so only one of them is sure to name rank 2.
TEST(MeshCommunicatorTest, ADeadPeerIsNamedWithItsAddress) {
  InMemoryKeyValue kv;
  std::vector<absl::Status> results(3);
  OnMesh(
      3, &kv, [](int rank) { return RankOptions(rank, 3, true); },
      [&](int rank, absl::StatusOr<Communicator*> comm) {
        ASSERT_TRUE(comm.ok()) << comm.status();
        if (rank == 2) return;  // its sockets close as the thread ends
        std::vector<float> data(100000, 1.0f);
        results[rank] = (*comm)->AllReduceSum(data.data(), data.size());
      });
  int named_rank_2 = 0;
  for (int rank : {0, 1}) {
    EXPECT_TRUE(absl::IsUnavailable(results[rank])) << results[rank];
    const std::string message(results[rank].message());
    EXPECT_THAT(message, ::testing::ContainsRegex(
                             "rank [0-2] \\(127\\.0\\.0\\.1:[0-9]+\\)"));
    if (::testing::Value(message, ::testing::ContainsRegex(
                                      "rank 2 \\(127\\.0\\.0\\.1:[0-9]+\\)"))) {
      ++named_rank_2;
    }
  }
  EXPECT_GE(named_rank_2, 1) << results[0] << "\n" << results[1];
}

// Before the real peer arrives, rank 0's port gets the Gloo header that
// killed workers, garbage, silence, bare connects, a Hello made with
// another generation's secret and a replayed member's Hello that never
// confirms. Each is refused; the real rank 1 then connects and the
// all-reduce is right.
TEST(MeshCommunicatorTest, StrangersOnThePortAreRefusedAndTheMembersConnect) {
  InMemoryKeyValue kv;
  auto options = RankOptions(0, 2, true);
  options.handshake_timeout = absl::Milliseconds(300);
  auto zero = MeshCommunicator::Create(options);
  ASSERT_TRUE(zero.ok());
  const std::string address = (*zero)->listen_address();
  absl::Status zero_result;
  std::vector<float> zero_data(5000, 1.0f);
  std::thread zero_thread([&] {
    zero_result = (*zero)->Connect(&kv);
    if (zero_result.ok()) {
      zero_result = (*zero)->AllReduceSum(zero_data.data(), zero_data.size());
    }
  });
  std::vector<int> strangers;
  auto stranger = [&](const std::string& bytes) {
    int fd = ConnectTo(address);
    if (!bytes.empty()) {
      EXPECT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
                static_cast<ssize_t>(bytes.size()));
    }
    strangers.push_back(fd);
  };
  // struct.pack("<6Q", 1<<62, 1, 0x41<<56, 0, 1<<62, 0): Gloo's header.
  uint64_t gloo_header[6] = {uint64_t{1} << 62, 1, uint64_t{0x41} << 56, 0,
                             uint64_t{1} << 62, 0};
  stranger(std::string(reinterpret_cast<char*>(gloo_header), 48));
  stranger(std::string(kHelloSize, 'x'));
  stranger("");                               // silence
  for (int i = 0; i < 80; ++i) stranger("");  // a flood of bare connects
  Membership other = TestMembership(1, 2);
  other.pair_keys[0] = std::string(kSecretSize, 'o');
  stranger(Ok(MakeHello(other, 1, 0, true)).bytes);
  // A member's Hello, replayed: it never confirms.
  stranger(Ok(MakeHello(TestMembership(1, 2), 1, 0, true)).bytes);
  auto one = MeshCommunicator::Connect(&kv, RankOptions(1, 2, true));
  ASSERT_TRUE(one.ok()) << one.status();
  std::vector<float> one_data(5000, 2.0f);
  ASSERT_TRUE((*one)->AllReduceSum(one_data.data(), one_data.size()).ok());
  zero_thread.join();
  ASSERT_TRUE(zero_result.ok()) << zero_result;
  EXPECT_EQ(zero_data[4999], 3.0f);
  EXPECT_EQ(one_data[0], 3.0f);
  // Those whose handshake ended before the peer came were all refused.
  EXPECT_GE((*zero)->refused(), 3);
  for (int fd : strangers) close(fd);
}

// Issue 52 §3: one member's Hello, captured on the wire and replayed on
// more connections than rank 0 keeps handshakes for, passes its MAC every
// time but cannot confirm. Were each kept until its timeout, the replays
// would hold every slot and the real rank 1 would be refused: a nonce seen
// before is refused at once instead.
TEST(MeshCommunicatorTest, AReplayedHelloHoldsNoHandshakeSlot) {
  InMemoryKeyValue kv;
  auto options = RankOptions(0, 2, true);
  options.handshake_timeout = absl::Seconds(60);
  auto zero = MeshCommunicator::Create(options);
  ASSERT_TRUE(zero.ok());
  const std::string address = (*zero)->listen_address();
  absl::Status zero_result;
  std::thread zero_thread([&] { zero_result = (*zero)->Connect(&kv); });
  const std::string captured =
      Ok(MakeHello(TestMembership(1, 2), 1, 0, true)).bytes;
  std::vector<int> replays;
  for (int i = 0; i < MeshCommunicator::kMaxPendingHandshakes + 8; ++i) {
    int fd = ConnectTo(address);
    EXPECT_EQ(send(fd, captured.data(), captured.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(captured.size()));
    replays.push_back(fd);
  }
  auto one_options = RankOptions(1, 2, true);
  one_options.timeout = absl::Seconds(20);
  auto one = MeshCommunicator::Connect(&kv, one_options);
  ASSERT_TRUE(one.ok()) << one.status();
  zero_thread.join();
  ASSERT_TRUE(zero_result.ok()) << zero_result;
  EXPECT_GE((*zero)->refused(), MeshCommunicator::kMaxPendingHandshakes);
  for (int fd : replays) close(fd);
}

// A rank holding another generation's secret cannot join: the member it
// calls refuses it, and it cannot pass for rank 0 either.
TEST(MeshCommunicatorTest, ARankWithAnotherSecretIsRefused) {
  InMemoryKeyValue kv;
  std::vector<absl::Status> results(2);
  OnMesh(
      2, &kv,
      [](int rank) {
        auto options = RankOptions(rank, 2, true);
        options.timeout = absl::Seconds(2);
        options.handshake_timeout = absl::Milliseconds(300);
        if (rank == 1) options.membership.generation = 4;
        return options;
      },
      [&](int rank, absl::StatusOr<Communicator*> comm) {
        results[rank] = comm.status();
      });
  EXPECT_TRUE(absl::IsDeadlineExceeded(results[0])) << results[0];
  EXPECT_FALSE(results[1].ok());
}

// Every worker of a job must agree on encryption: the rank that sees the
// other setting says which ranks run with which.
TEST(MeshCommunicatorTest, AnEncryptionMismatchIsNamed) {
  InMemoryKeyValue kv;
  std::vector<absl::Status> results(2);
  OnMesh(
      2, &kv,
      [](int rank) {
        auto options = RankOptions(rank, 2, rank == 0);
        options.timeout = absl::Seconds(2);
        return options;
      },
      [&](int rank, absl::StatusOr<Communicator*> comm) {
        results[rank] = comm.status();
      });
  EXPECT_TRUE(absl::IsFailedPrecondition(results[0])) << results[0];
  EXPECT_THAT(results[0].message(),
              HasSubstr("--data-plane-encryption off, rank 0 with on"));
  EXPECT_FALSE(results[1].ok());
}

// A proxy between rank 1 and rank 0 (rank 1 reads the proxy's address as
// rank 0's): it records what rank 1 sends, and may flip one byte of it.
class Proxy {
 public:
  Proxy(std::string target, int64_t flip_at)
      : target_(std::move(target)), flip_at_(flip_at) {
    listen_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &any.sin_addr);
    bind(listen_, reinterpret_cast<sockaddr*>(&any), sizeof(any));
    listen(listen_, 1);
    socklen_t size = sizeof(any);
    getsockname(listen_, reinterpret_cast<sockaddr*>(&any), &size);
    address_ = absl::StrCat("127.0.0.1:", ntohs(any.sin_port));
    thread_ = std::thread([this] { Run(); });
  }
  ~Proxy() {
    thread_.join();
    close(listen_);
  }
  const std::string& address() const { return address_; }
  // What rank 1 sent, once the connection ended.
  std::string captured() {
    thread_.join();
    thread_ = std::thread([] {});
    return captured_;
  }

 private:
  void Run() {
    int client = accept(listen_, nullptr, nullptr);
    int server = ConnectTo(target_);
    char buffer[65536];
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    while (poll(fds, 2, 30000) > 0) {
      bool ended = false;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].revents == 0) continue;
        ssize_t n = recv(fds[i].fd, buffer, sizeof(buffer), 0);
        if (n <= 0) {
          ended = true;
          break;
        }
        if (i == 0) {
          const int64_t start = captured_.size();
          captured_.append(buffer, n);
          if (flip_at_ >= start && flip_at_ < start + n) {
            buffer[flip_at_ - start] ^= 0x01;
          }
        }
        send(fds[1 - i].fd, buffer, n, MSG_NOSIGNAL);
      }
      if (ended) break;
    }
    close(client);
    close(server);
  }

  const std::string target_;
  const int64_t flip_at_;
  int listen_ = -1;
  std::string address_;
  std::string captured_;
  std::thread thread_;
};

// Rank 1 reads the proxy's address when it asks for rank 0's.
class ProxiedKeyValue : public KeyValueClient {
 public:
  ProxiedKeyValue(KeyValueClient* inner, std::string proxy)
      : inner_(inner), proxy_(std::move(proxy)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    auto value = inner_->Get(key, timeout);
    if (key == "0" && value.ok()) return proxy_;
    return value;
  }
  void Cancel() override { inner_->Cancel(); }

 private:
  KeyValueClient* const inner_;
  const std::string proxy_;
};

// A man in the middle runs an all-reduce of 2 ranks through the proxy.
// Returns each rank's result; `captured` gets what rank 1 sent.
std::vector<absl::Status> ThroughProxy(bool encrypted, int64_t flip_at,
                                       const std::vector<float>& values,
                                       std::string* captured) {
  InMemoryKeyValue kv;
  auto zero = MeshCommunicator::Create(RankOptions(0, 2, encrypted));
  EXPECT_TRUE(zero.ok());
  Proxy proxy((*zero)->listen_address(), flip_at);
  ProxiedKeyValue proxied(&kv, proxy.address());
  std::vector<absl::Status> results(2);
  std::thread zero_thread([&] {
    results[0] = (*zero)->Connect(&kv);
    std::vector<float> data(values.size(), 0.0f);
    if (results[0].ok()) {
      results[0] = (*zero)->AllReduceSum(data.data(), data.size());
    }
    zero->reset();  // closes: the proxy's connection ends
  });
  {
    auto one =
        MeshCommunicator::Connect(&proxied, RankOptions(1, 2, encrypted));
    results[1] = one.status();
    std::vector<float> data = values;
    if (one.ok()) results[1] = (*one)->AllReduceSum(data.data(), data.size());
    zero_thread.join();
  }
  *captured = proxy.captured();
  return results;
}

// The bytes of a training step's gradients never appear on the wire when
// encrypted; the same capture unencrypted shows them (the capture works).
TEST(MeshCommunicatorTest, ACaptureOfTheWireHoldsNoPlaintextGradients) {
  std::vector<float> gradients(20000);
  for (size_t i = 0; i < gradients.size(); ++i) {
    gradients[i] = 0.001f * static_cast<float>(i % 1000) - 0.37f;
  }
  // Rank 1 sends rank 0 its copy of chunk 0: the first half.
  const std::string needle(reinterpret_cast<const char*>(&gradients[100]), 64);
  std::string captured;
  auto results = ThroughProxy(true, -1, gradients, &captured);
  ASSERT_TRUE(results[0].ok() && results[1].ok()) << results[0] << results[1];
  EXPECT_GT(captured.size(), gradients.size() * 2);
  EXPECT_EQ(captured.find(needle), std::string::npos);
  results = ThroughProxy(false, -1, gradients, &captured);
  ASSERT_TRUE(results[0].ok() && results[1].ok());
  EXPECT_NE(captured.find(needle), std::string::npos);
}

// One bit flipped in a frame's payload (encrypted) or in a frame header
// (unencrypted): rank 0 closes the connection and fails, naming rank 1 and
// the address it came from; nothing crashes.
TEST(MeshCommunicatorTest, AnAlteredFrameFailsTheCallNamingThePeer) {
  std::vector<float> values(20000, 0.5f);
  std::string captured;
  // After the handshake (Hello, Confirm) and the barrier's frame: the first
  // all-reduce frame's payload, or its header's sequence number.
  const int64_t handshake = kHelloSize + kConfirmSize;
  auto results = ThroughProxy(
      true,
      handshake + kFrameHeaderSize + 1 + kFrameTagSize + kFrameHeaderSize + 5,
      values, &captured);
  EXPECT_TRUE(absl::IsUnavailable(results[0])) << results[0];
  EXPECT_THAT(std::string(results[0].message()),
              ::testing::ContainsRegex(
                  "rank 1 \\(127\\.0\\.0\\.1:[0-9]+\\) frame 1 failed "
                  "authentication"));
  results =
      ThroughProxy(false, handshake + kFrameHeaderSize + 1, values, &captured);
  EXPECT_TRUE(absl::IsUnavailable(results[0])) << results[0];
  EXPECT_THAT(std::string(results[0].message()),
              HasSubstr("malformed frame header"));
}

// A TCP connect to "host:port" that does not wait for the kernel's answer
// (the listener's queue may be full): the test's silent stranger.
int ConnectWithoutWaiting(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(colon + 1), &port));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to));
  return fd;
}

// Issue 35: 200 silent connections held on every rank's port (more than
// the listen queue and the 64 pending handshakes) while 3 ranks meet. The
// listener drains its queue from the start, evicts silent handshakes for
// newcomers, and a member whose handshake was closed tries again: the
// ranks connect and sum.
TEST(MeshCommunicatorTest, SilentFloodsOnEveryPortDoNotKeepTheMembersOut) {
  constexpr int kWorld = 3;
  InMemoryKeyValue kv;
  std::vector<std::unique_ptr<MeshCommunicator>> comms;
  std::vector<int> strangers;
  for (int rank = 0; rank < kWorld; ++rank) {
    auto options = RankOptions(rank, kWorld, true);
    options.handshake_timeout = absl::Seconds(5);
    auto comm = MeshCommunicator::Create(options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    for (int i = 0; i < 200; ++i) {
      strangers.push_back(ConnectWithoutWaiting((*comm)->listen_address()));
    }
    comms.push_back(*std::move(comm));
  }
  std::vector<absl::Status> results(kWorld);
  std::vector<std::vector<float>> data(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      results[rank] = comms[rank]->Connect(&kv);
      data[rank].assign(1000, float(rank + 1));
      if (results[rank].ok()) {
        results[rank] =
            comms[rank]->AllReduceSum(data[rank].data(), data[rank].size());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << rank << ": " << results[rank];
    EXPECT_EQ(data[rank][999], 6.0f);
  }
  // Rank 2 accepts nobody: its strangers wait in its queue, unrefused.
  EXPECT_GT(comms[0]->refused() + comms[1]->refused(), 0);
  for (int fd : strangers) close(fd);
}

// Issue 35: at 64 pending handshakes the listener closed the oldest, even
// one whose Hello had passed the MAC. Here a member (played by the test)
// sends its Hello, reads the Reply, then 100 silent strangers arrive before
// it confirms: its handshake survives them, and the rendezvous completes.
TEST(MeshCommunicatorTest, AnAuthenticatedHandshakeIsNeverEvicted) {
  InMemoryKeyValue kv;
  auto options = RankOptions(0, 2, /*encrypted=*/false);
  options.timeout = absl::Seconds(20);
  auto zero = MeshCommunicator::Create(options);
  ASSERT_TRUE(zero.ok()) << zero.status();
  absl::Status zero_result;
  std::thread zero_thread([&] { zero_result = (*zero)->Connect(&kv); });

  const Membership member = TestMembership(1, 2);
  const Hello hello = Ok(MakeHello(member, 1, 0, /*encrypted=*/false));
  int fd = ConnectTo((*zero)->listen_address());
  ASSERT_EQ(send(fd, hello.bytes.data(), kHelloSize, MSG_NOSIGNAL),
            static_cast<ssize_t>(kHelloSize));
  std::string reply(kReplySize, '\0');
  ASSERT_EQ(recv(fd, reply.data(), kReplySize, MSG_WAITALL),
            static_cast<ssize_t>(kReplySize));
  ASSERT_TRUE(CheckReply(member, hello, reply).ok());
  std::vector<int> strangers;
  for (int i = 0; i < 100; ++i) {
    strangers.push_back(ConnectTo((*zero)->listen_address()));
  }
  // Wait until the listener has taken them all: each was refused or is
  // pending; 36 refusals mean the 64 slots filled and evictions began.
  while ((*zero)->refused() < 100 - MeshCommunicator::kMaxPendingHandshakes) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const std::string confirm = Ok(MakeConfirm(member, hello, reply));
  ASSERT_EQ(send(fd, confirm.data(), kConfirmSize, MSG_NOSIGNAL),
            static_cast<ssize_t>(kConfirmSize));
  // Rank 0's closing barrier: one framed byte each way, in clear.
  FrameSealer sealer("");
  const char token = 1;
  sealer.Start(&token, 1);
  while (!sealer.done()) {
    const absl::Span<const char> pending = Ok(sealer.Pending());
    ASSERT_EQ(send(fd, pending.data(), pending.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(pending.size()));
    sealer.Advance(pending.size());
  }
  char got = 0;
  FrameOpener opener("");
  opener.Start(&got, 1);
  while (!opener.done()) {
    absl::Span<char> want = opener.Want();
    const ssize_t n = recv(fd, want.data(), want.size(), 0);
    ASSERT_GT(n, 0);
    ASSERT_TRUE(opener.Received(n).ok());
  }
  zero_thread.join();
  EXPECT_TRUE(zero_result.ok()) << zero_result;
  EXPECT_EQ(got, 1);
  close(fd);
  for (int s : strangers) close(s);
}

// Issue 35: a seal that fails (OpenSSL without memory) sent a frame with a
// zero tag and went on. Now the call fails on both sides, naming the peer,
// and the connection is closed.
TEST(MeshCommunicatorTest, AFrameThatCannotBeSealedFailsTheCall) {
  InMemoryKeyValue kv;
  std::vector<absl::Status> results(2);
  absl::Notification connected[2];
  absl::Notification failing;
  OnMesh(
      2, &kv, [](int rank) { return RankOptions(rank, 2, true); },
      [&](int rank, absl::StatusOr<Communicator*> comm) {
        connected[rank].Notify();
        if (!comm.ok()) {
          results[rank] = comm.status();
          return;
        }
        failing.WaitForNotification();
        std::vector<float> data(1000, 1.0f);
        results[rank] = (*comm)->AllReduceSum(data.data(), data.size());
      },
      [&] {
        connected[0].WaitForNotification();
        connected[1].WaitForNotification();
        SetCryptoFailsForTesting(true);
        failing.Notify();
      });
  SetCryptoFailsForTesting(false);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(results[rank].ok()) << rank;
    EXPECT_THAT(std::string(results[rank].message()),
                HasSubstr(absl::StrCat("rank ", 1 - rank, " (127.0.0.1:")));
  }
  EXPECT_TRUE(absl::StrContains(results[0].message(), "could not seal") ||
              absl::StrContains(results[1].message(), "could not seal"))
      << results[0] << "\n"
      << results[1];
}

// Each exchange of at least 64 KiB records the rate at which each peer's
// data arrives (what heartbeats carry to the coordinator); smaller ones,
// latency-bound, do not. An exchange whose data was all queued before the
// first read (this rank came late) tells nothing, so the large one, 4 MB
// from each peer (more than a socket buffer holds at first), runs until
// every rank has measured every peer.
TEST(MeshCommunicatorTest, ExchangesMeasureTheThroughputWithEachPeer) {
  InMemoryKeyValue kv;
  LinkMeter meters[3];
  std::vector<absl::Status> results(3);
  OnMesh(
      3, &kv,
      [&](int rank) {
        auto options = RankOptions(rank, 3, true);
        options.links = &meters[rank];
        return options;
      },
      [&](int rank, absl::StatusOr<Communicator*> comm) {
        if (!comm.ok()) {
          results[rank] = comm.status();
          return;
        }
        std::vector<float> small(100, 1.0f);
        results[rank] = (*comm)->AllReduceSum(small.data(), small.size());
        if (!results[rank].ok()) return;
        EXPECT_EQ(meters[rank].Rates(), std::vector<double>(3, 0.0));
        std::vector<float> large(3000000, 1.0f);
        // The same count on every rank: each stops when all are measured.
        for (int round = 0; round < 10 && results[rank].ok(); ++round) {
          results[rank] = (*comm)->AllReduceSum(large.data(), large.size());
          // Every rank's verdict, summed, so that all run the same rounds.
          std::vector<float> unmeasured(1, 0.0f);
          const std::vector<double> rates = meters[rank].Rates();
          for (int peer = 0; peer < 3; ++peer) {
            if (peer != rank && rates[peer] == 0) unmeasured[0] = 1;
          }
          if (!results[rank].ok()) return;
          results[rank] = (*comm)->AllReduceSum(unmeasured.data(), 1);
          if (unmeasured[0] == 0) break;
        }
      });
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << results[rank];
    const std::vector<double> rates = meters[rank].Rates();
    ASSERT_EQ(rates.size(), 3u);
    for (int peer = 0; peer < 3; ++peer) {
      if (peer == rank) {
        EXPECT_EQ(rates[peer], 0.0);
      } else {
        EXPECT_GT(rates[peer], 0.0) << rank << " with " << peer;
      }
    }
  }
}

}  // namespace
}  // namespace lockstep::worker
