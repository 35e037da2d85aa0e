// lockstep across hosts (tests/netbed/): every daemon in a network namespace
// of its own with its own address, joined through a bridge, and failures
// that are not process deaths: a cable pulled at the switch, a partition
// that heals, the coordinator's host cut off, a host that never answers, a
// host on a slow link.
// The coordinator runs in host 0, worker I in host I + 1 (spares after
// them); the CLI runs in host 0 too. Heartbeats time out after 2 s here.
#include "tests/netbed/netbed.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/cert_maker.h"
#include "common/proto_json.h"
#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kHeartbeatSeconds = 2;
// The MLP (a global batch 2, 3 and 4 ranks divide), one step per progress
// report.
const std::vector<std::string> kJob = {"global_batch_size=96",
                                       "log_every_steps=1"};

class NetbedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = netbed::WhyUnavailable();
    if (!why.empty()) GTEST_SKIP() << why;
    const std::string left = netbed::Leftovers();
    if (!left.empty()) {
      ADD_FAILURE() << "an earlier run left namespaces or veths behind "
                       "(removed now):\n"
                    << left;
      netbed::RemoveLeftovers();
    }
    dir_ = TempDir("netbed");
  }

  void TearDown() override {
    processes_.TerminateAll(absl::Seconds(1));
    bed_.reset();
    if (bed_built_) EXPECT_EQ(netbed::Leftovers(), "");
  }

  // A bed of a coordinator host and `workers` + `spares` worker hosts; the
  // coordinator and every worker started.
  void StartCluster(const std::string& name, int workers, int spares = 0) {
    workers_ = workers;
    spares_ = spares;
    auto bed = netbed::Bed::Up(name, 1 + workers + spares);
    ASSERT_TRUE(bed.ok()) << bed.status();
    bed_ = *std::move(bed);
    bed_built_ = true;
    StartCoordinator();
    for (int i = 0; i < workers; ++i) StartTask("worker", i);
    for (int i = 0; i < spares; ++i) StartTask("spare", i);
  }

  int HostOf(const std::string& type, int index) const {
    return 1 + (type == "spare" ? workers_ : 0) + index;
  }

  std::string ClusterJson() const {
    auto list = [&](const std::string& type, int count) {
      std::vector<std::string> addresses;
      for (int i = 0; i < count; ++i) {
        addresses.push_back(
            absl::StrCat("\"", bed_->Address(HostOf(type, i)), ":7000\""));
      }
      return absl::StrCat("[", absl::StrJoin(addresses, ", "), "]");
    };
    return absl::StrCat(
        R"({"cluster": {"worker": )", list("worker", workers_),
        spares_ > 0 ? absl::StrCat(R"(, "spare": )", list("spare", spares_))
                    : "",
        "}}");
  }

  // The TLS flags of `spiffe_id`, its certificate naming `host`'s address.
  std::vector<std::string> TlsOf(const std::string& spiffe_id, int host) {
    CertificateSpec spec;
    spec.spiffe_id = spiffe_id;
    spec.dns_names = {};
    spec.ip_addresses = {bed_->Address(host)};
    auto files = IssueTlsFiles(HarnessCa(), spec, dir_,
                               absl::StrCat("cert-", ++certificates_));
    EXPECT_TRUE(files.ok()) << files.status();
    return TlsFlags(files.value_or(TlsOptions()));
  }

  void StartCoordinator() {
    std::vector<std::string> argv = {kBin + "/lockstep-coordinator",
                                     "--listen",
                                     bed_->Address(0) + ":0",
                                     "--state-dir",
                                     dir_ + "/state",
                                     "--cluster",
                                     ClusterJson(),
                                     "--heartbeat-timeout",
                                     absl::StrCat(kHeartbeatSeconds)};
    for (std::string& flag : TlsOf(kCoordinatorId, 0)) argv.push_back(flag);
    int out = -1;
    auto pid = processes_.Spawn("coordinator", bed_->Exec(0, argv), {},
                                dir_ + "/coordinator.log", &out);
    ASSERT_TRUE(pid.ok()) << pid.status();
    std::string line;
    char c;
    while (read(out, &c, 1) == 1 && c != '\n') line.push_back(c);
    close(out);
    address_ = line.substr(line.rfind(' ') + 1);
    ASSERT_THAT(address_, HasSubstr(bed_->Address(0) + ":")) << line;
  }

  pid_t StartTask(const std::string& type, int index,
                  std::vector<std::string> env = {}) {
    const int host = HostOf(type, index);
    const std::string tf_config = absl::StrCat(
        R"({"cluster": )", ClusterJson().substr(12, ClusterJson().size() - 13),
        R"(, "task": {"type": ")", type, R"(", "index": )", index, "}}");
    std::vector<std::string> argv = {kBin + "/lockstep-worker",
                                     "--coordinator",
                                     address_,
                                     "--threads",
                                     "1",
                                     "--device",
                                     "cpu"};
    for (std::string& flag :
         TlsOf(absl::StrCat("spiffe://lockstep/worker/", type, "/", index),
               host)) {
      argv.push_back(flag);
    }
    env.insert(env.end(), {"TF_CONFIG=" + tf_config, "OMP_NUM_THREADS=1",
                           "OPENBLAS_NUM_THREADS=1"});
    auto pid = processes_.Spawn(
        absl::StrCat(type, " ", index), bed_->Exec(host, argv), env,
        absl::StrCat(dir_, "/", type, "-", index, ".log"));
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.value_or(-1);
  }

  // The CLI, run in the coordinator's host.
  Result Lockstep(std::vector<std::string> args) {
    args.insert(args.begin(), kBin + "/lockstep");
    return RunCommand(bed_->Exec(0, args),
                      {"LOCKSTEP_COORDINATOR=" + address_});
  }

  std::string Submit(const std::vector<std::string>& sets) {
    std::vector<std::string> args = {"submit", kMlp};
    for (const std::string& set : sets) {
      args.push_back("--set");
      args.push_back(set);
    }
    Result submit = Lockstep(args);
    EXPECT_EQ(submit.code, 0) << submit.err;
    return submit.out.substr(0, submit.out.find('\n'));
  }

  // The job's full status (`lockstep status JOB --json` prints a list of
  // one).
  v1::JobStatus Status(const std::string& job) {
    Result shown = Lockstep({"status", job, "--json"});
    v1::JobStatus status;
    EXPECT_EQ(shown.code, 0) << shown.err;
    const size_t open = shown.out.find('{');
    const size_t close = shown.out.rfind('}');
    EXPECT_TRUE(open != std::string::npos && close != std::string::npos &&
                FromJson(shown.out.substr(open, close - open + 1), &status,
                         "lockstep status --json")
                    .ok())
        << "lockstep status " << job << " --json: " << shown.out << shown.err;
    return status;
  }

  // Asks `done` (which runs the CLI) until it holds; false, a test
  // failure, after 5 minutes.
  static bool WaitFor(const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + absl::Minutes(5);
    while (absl::Now() < deadline) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(100));  // the CLI's next look
    }
    return false;
  }

  // Reads the job's status until `done` holds; returns that status.
  v1::JobStatus WaitUntil(
      const std::string& job,
      const std::function<bool(const v1::JobStatus&)>& done) {
    v1::JobStatus status;
    if (!WaitFor([&] {
          status = Status(job);
          return done(status);
        })) {
      ADD_FAILURE() << "job " << job << " did not get there in 5 minutes: "
                    << ToJson(status, JsonStyle::kCompact);
    }
    return status;
  }

  // `lockstep checkpoints JOB --json`, by name.
  std::map<std::string, google::protobuf::Struct> Checkpoints(
      const std::string& job) {
    Result listed = Lockstep({"checkpoints", job, "--json"});
    EXPECT_EQ(listed.code, 0) << listed.err;
    google::protobuf::ListValue list;
    EXPECT_TRUE(
        google::protobuf::util::JsonStringToMessage(listed.out, &list).ok())
        << listed.out;
    std::map<std::string, google::protobuf::Struct> out;
    for (const auto& value : list.values()) {
      out[value.struct_value().fields().at("name").string_value()] =
          value.struct_value();
    }
    return out;
  }

  static bool Ended(const v1::JobStatus& s) {
    return s.state() == v1::JOB_STATE_SUCCEEDED ||
           s.state() == v1::JOB_STATE_FAILED ||
           s.state() == v1::JOB_STATE_STOPPED;
  }

  // `kind` events of the job, oldest first.
  static std::vector<v1::JobEvent> Events(const v1::JobStatus& status,
                                          const std::string& kind) {
    std::vector<v1::JobEvent> found;
    for (const v1::JobEvent& event : status.events()) {
      if (event.kind() == kind) found.push_back(event);
    }
    return found;
  }

  static std::string History(const v1::JobStatus& status) {
    std::string text;
    for (const v1::JobEvent& event : status.events()) {
      absl::StrAppend(&text, event.kind(), ": ", event.message(), "\n");
    }
    return text;
  }

  // What `lockstep local --workers N --threads 1` makes of `sets`.
  std::string LocalDigest(int workers, const std::vector<std::string>& sets) {
    std::vector<std::string> argv = {
        kBin + "/lockstep", "local", "--workers", absl::StrCat(workers),
        "--threads",        "1",     "--json"};
    for (const std::string& set : sets) {
      argv.push_back("--set");
      argv.push_back(set);
    }
    argv.push_back(kMlp);
    Result local = RunCommand(argv);
    EXPECT_EQ(local.code, 0) << local.err;
    return LastJsonLine(local.out).fields().at("model_digest").string_value();
  }

  client::ProcessGroup processes_;
  std::unique_ptr<netbed::Bed> bed_;
  bool bed_built_ = false;
  std::string dir_;
  std::string address_;
  int workers_ = 0;
  int spares_ = 0;
  int certificates_ = 0;
};

// Issue 35: nothing in lockstep assumes one host. Three workers, each on its
// own address, with certificates naming those addresses, train to the
// digest `lockstep local` gets on 127.0.0.1.
TEST_F(NetbedTest, ThreeHostsTrainToTheLocalDigest) {
  StartCluster("three", 3);
  std::vector<std::string> sets = kJob;
  sets.push_back("max_steps=40");
  const std::string job = Submit(sets);
  ASSERT_FALSE(job.empty());
  const v1::JobStatus done = WaitUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.generations(), 1);
  ASSERT_EQ(done.ranks_size(), 3);
  for (const v1::RankResult& rank : done.ranks()) {
    EXPECT_EQ(rank.host(), bed_->Address(1 + rank.rank()));
  }
  EXPECT_EQ(done.ranks(0).model_digest(), LocalDigest(3, sets));
}

// Seconds between two events (their times, on the coordinator's clock).
double Between(const v1::JobEvent& from, const v1::JobEvent& to) {
  return to.time() - from.time();
}

// Issue 35: worker 1's cable is pulled at the switch mid-training (its
// process lives on). The coordinator names it when its heartbeats stop, the
// survivors are aborted out of the collective they are blocked in (not
// after the 60 s rendezvous or collective timeout), and when the cable is
// back the worker rejoins and the job ends with the uninterrupted digest.
TEST_F(NetbedTest, ACutCableIsNamedWithinTheHeartbeatTimeoutAndTheJobReforms) {
  StartCluster("cut", 3);
  std::vector<std::string> sets = kJob;
  sets.push_back("max_steps=400");
  const std::string job = Submit(sets);
  ASSERT_FALSE(job.empty());
  WaitUntil(job,
            [](const v1::JobStatus& s) { return s.step() >= 40 || Ended(s); });
  const absl::Time cut = absl::Now();
  ASSERT_TRUE(bed_->Cut(HostOf("worker", 1)).ok());
  v1::JobStatus failed = WaitUntil(job, [](const v1::JobStatus& s) {
    return !Events(s, "worker_failed").empty() || Ended(s);
  });
  const double named_after = absl::ToDoubleSeconds(absl::Now() - cut);
  ASSERT_EQ(Events(failed, "worker_failed").size(), 1u) << History(failed);
  const v1::JobEvent named = Events(failed, "worker_failed")[0];
  EXPECT_THAT(named.message(),
              AllOf(HasSubstr("worker:1"), HasSubstr(bed_->Address(2)),
                    HasSubstr("missed heartbeats"), HasSubstr("partitioned")));
  ASSERT_TRUE(bed_->Heal(HostOf("worker", 1)).ok());
  const v1::JobStatus done = WaitUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_GE(done.generations(), 2);
  const std::vector<v1::JobEvent> resumed = Events(done, "resumed");
  ASSERT_FALSE(resumed.empty()) << History(done);
  EXPECT_THAT(resumed.back().message(), HasSubstr("; 0 steps repeated"));
  const std::vector<v1::JobEvent> started = Events(done, "generation_started");
  ASSERT_GE(started.size(), 2u);
  std::cout << "netbed: cut cable named " << named_after
            << " s after the cut; generation " << done.generation()
            << " started " << Between(named, started.back())
            << " s after the failure\n";
  EXPECT_EQ(done.ranks(0).model_digest(), LocalDigest(3, sets));
}

// Issue 35: a host whose link is down before the generation starts (its
// session still looks alive) never gets its assignment. The generation
// fails when its heartbeats stop, naming it, within seconds, not after the
// 60 s rendezvous; once the host is back the job trains.
TEST_F(NetbedTest, AHostThatDoesNotAnswerAtRendezvousIsNamedWithinSeconds) {
  StartCluster("silent", 3);
  // Every worker registered (the static cluster is whole) before the cut.
  ASSERT_TRUE(WaitFor([&] {
    Result workers = Lockstep({"workers"});
    return absl::StrContains(workers.out, "worker:2") &&
           absl::StrContains(workers.out, "worker:0") &&
           absl::StrContains(workers.out, "worker:1");
  }));
  ASSERT_TRUE(bed_->Cut(HostOf("worker", 2)).ok());
  std::vector<std::string> sets = kJob;
  sets.push_back("max_steps=30");
  const std::string job = Submit(sets);
  ASSERT_FALSE(job.empty());
  v1::JobStatus failed = WaitUntil(job, [](const v1::JobStatus& s) {
    return !Events(s, "worker_failed").empty() || Ended(s);
  });
  ASSERT_FALSE(Events(failed, "worker_failed").empty()) << History(failed);
  const v1::JobEvent named = Events(failed, "worker_failed")[0];
  EXPECT_THAT(named.message(),
              AllOf(HasSubstr("worker:2"), HasSubstr(bed_->Address(3))));
  const v1::JobEvent first = Events(failed, "generation_started")[0];
  const double after = Between(first, named);
  std::cout << "netbed: a silent host named " << after
            << " s after its generation started\n";
  // Named by the coordinator's heartbeat watch, not by a peer's 60 s wait.
  EXPECT_THAT(failed.error() + History(failed), Not(HasSubstr("waited 1m")));
  ASSERT_TRUE(bed_->Heal(HostOf("worker", 2)).ok());
  const v1::JobStatus done = WaitUntil(job, Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
}

// Issue 35: the coordinator's host is cut off mid-training. It fails every
// silent worker; the workers keep their replicas, and when the link is back
// they reconnect and the job resumes from their live state: nothing lost
// (no step repeated) or doubled (the uninterrupted digest).
TEST_F(NetbedTest, TheCoordinatorsHostCutOffLosesNothing) {
  StartCluster("coord", 2);
  std::vector<std::string> sets = kJob;
  sets.push_back("max_steps=600");
  const std::string job = Submit(sets);
  ASSERT_FALSE(job.empty());
  WaitUntil(job,
            [](const v1::JobStatus& s) { return s.step() >= 40 || Ended(s); });
  ASSERT_TRUE(bed_->Cut(0).ok());
  // The CLI runs in the coordinator's host: it still reaches it.
  WaitUntil(job, [](const v1::JobStatus& s) {
    return s.state() == v1::JOB_STATE_RECOVERING || Ended(s);
  });
  ASSERT_TRUE(bed_->Heal(0).ok());
  const v1::JobStatus done = WaitUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_GE(done.generations(), 2);
  for (const v1::JobEvent& resumed : Events(done, "resumed")) {
    EXPECT_THAT(resumed.message(), HasSubstr("'s live state; 0 steps repeated"))
        << History(done);
  }
  EXPECT_EQ(done.ranks(0).model_digest(), LocalDigest(2, sets));
}

// Issue 35: a partition that heals after the job moved on. The chief's cable
// is pulled; a spare takes rank 0 and the job trains on, committing
// checkpoints. When the old chief's link comes back its process is still in
// the old generation: it must rejoin as an idle worker, never report,
// commit or send gradients into a generation it no longer belongs to. The
// job ends with the uninterrupted digest, every rank result and every
// checkpoint commit after the cut is the new chief's, and the checkpoints
// are whole.
TEST_F(NetbedTest, APartitionThatHealsIsFencedOut) {
  StartCluster("fence", 2, /*spares=*/1);
  std::vector<std::string> plain = kJob;
  plain.push_back("max_steps=500");
  std::vector<std::string> sets = plain;
  sets.insert(sets.end(), {"checkpoint.backup_dir=" + dir_ + "/backup",
                           "checkpoint.save_every_steps=50",
                           "checkpoint.keep_backups=true"});
  const std::string job = Submit(sets);
  ASSERT_FALSE(job.empty());
  WaitUntil(job,
            [](const v1::JobStatus& s) { return s.step() >= 60 || Ended(s); });
  ASSERT_TRUE(bed_->Cut(HostOf("worker", 0)).ok());
  // The job moves on without it: the spare holds rank 0 and trains.
  v1::JobStatus moved = WaitUntil(job, [](const v1::JobStatus& s) {
    return (!Events(s, "rank_replaced").empty() && s.generation() >= 2 &&
            !Events(s, "resumed").empty()) ||
           Ended(s);
  });
  ASSERT_FALSE(Events(moved, "rank_replaced").empty()) << History(moved);
  const int64_t moved_at = moved.step();
  ASSERT_TRUE(bed_->Heal(HostOf("worker", 0)).ok());
  const v1::JobStatus done = WaitUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.generation(), moved.generation()) << History(done);
  for (const v1::RankResult& rank : done.ranks()) {
    EXPECT_NE(rank.worker_id(), "worker:0") << History(done);
  }
  EXPECT_EQ(done.ranks(0).worker_id(), "spare:0");
  EXPECT_EQ(done.ranks(0).host(), bed_->Address(HostOf("spare", 0)));
  // Nothing of worker:0 after it failed: no report, no commit.
  bool failed_seen = false;
  for (const v1::JobEvent& event : done.events()) {
    if (event.kind() == "worker_failed") failed_seen = true;
    if (failed_seen && event.kind() != "worker_reconnected" &&
        event.kind() != "worker_failed") {
      EXPECT_NE(event.worker_id(), "worker:0")
          << event.kind() << ": " << event.message();
    }
  }
  // Every checkpoint committed and kept verifies (older ones were removed
  // by the retention), some after the cut, and those after it are
  // generation 2's.
  const auto checkpoints = Checkpoints(job);
  int64_t last = 0;
  for (const auto& [name, checkpoint] : checkpoints) {
    const auto& fields = checkpoint.fields();
    const int64_t step = static_cast<int64_t>(fields.at("step").number_value());
    last = std::max(last, step);
    if (step > moved_at) {
      EXPECT_EQ(fields.at("generation").number_value(), moved.generation())
          << name;
    }
    if (fields.at("check").string_value() == "removed") continue;
    EXPECT_TRUE(fields.at("verified").bool_value())
        << name << ": " << ToJson(checkpoint, JsonStyle::kCompact);
  }
  EXPECT_GT(last, moved_at);
  EXPECT_GT(done.step(), moved_at);
  EXPECT_EQ(done.ranks(0).model_digest(), LocalDigest(2, plain));
}

// Issue 35: one host's link capped to a tenth of the others' (tbf, both
// ways). Training goes on, and the job's status names that host as the one
// with the slow link, from the rate at which every rank receives each
// peer's data. The job lets "auto" pick its all-reduce algorithm: the
// generation's status says which, and the times it chose by.
TEST_F(NetbedTest, AHostOnATenthOfTheBandwidthIsNamedAsTheSlowOne) {
  StartCluster("slow", 3);
  ASSERT_TRUE(bed_->Cap(HostOf("worker", 0), "1gbit").ok());
  ASSERT_TRUE(bed_->Cap(HostOf("worker", 1), "1gbit").ok());
  ASSERT_TRUE(bed_->Cap(HostOf("worker", 2), "100mbit").ok());
  std::vector<std::string> sets = kJob;
  sets.push_back("max_steps=150");
  sets.push_back("communication.algorithm=auto");
  const std::string job = Submit(sets);
  ASSERT_FALSE(job.empty());
  const v1::JobStatus named = WaitUntil(job, [](const v1::JobStatus& s) {
    return absl::StrContains(s.stall(), "slowest data-plane link") || Ended(s);
  });
  EXPECT_THAT(named.stall(),
              AllOf(HasSubstr("worker:2"), HasSubstr(bed_->Address(3))));
  std::cout << "netbed: " << named.stall() << "\n";
  const v1::JobStatus done = WaitUntil(job, Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  const std::vector<v1::JobEvent> chosen = Events(done, "all_reduce_algorithm");
  ASSERT_EQ(chosen.size(), 1u) << History(done);
  EXPECT_THAT(chosen[0].message(),
              AllOf(HasSubstr("generation 1 all-reduces "),
                    HasSubstr(" s by the ring"), HasSubstr("over 3 ranks")));
  EXPECT_THAT(done.plan().all_reduce_algorithm(),
              ::testing::AnyOf("direct", "ring"));
  EXPECT_TRUE(done.plan().has_algorithm_probe());
  std::cout << "netbed: " << chosen[0].message() << "\n";
}

}  // namespace
}  // namespace lockstep::integration
