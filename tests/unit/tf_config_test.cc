// TF_CONFIG parsing: ranks of chief and workers, non-training tasks, and
// every malformed config rejected with a clear message.
#include "common/tf_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace lockstep {
namespace {

using ::testing::HasSubstr;

constexpr char kTwoWorkers[] =
    R"({"cluster": {"worker": ["w0:2222", "w1:2222"]},
        "task": {"type": "worker", "index": 1}})";

TEST(TfConfigTest, ParsesClusterAndTask) {
  auto config = ParseTfConfig(kTwoWorkers);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->task.has_value());
  EXPECT_EQ(TaskName(*config->task), "worker:1");
  EXPECT_EQ(TaskAddress(config->cluster, *config->task), "w1:2222");
}

TEST(TfConfigTest, ChiefIsRankZeroWhenPresent) {
  auto config = ParseTfConfig(
      R"({"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}})");
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<v1::TaskId> tasks = TrainingTasks(config->cluster);
  ASSERT_EQ(tasks.size(), 3u);
  EXPECT_EQ(TaskName(tasks[0]), "chief:0");
  EXPECT_EQ(TaskName(tasks[1]), "worker:0");
  EXPECT_EQ(TaskName(tasks[2]), "worker:1");
  EXPECT_EQ(*RankOf(config->cluster, tasks[2]), 2);
}

TEST(TfConfigTest, WorkerZeroIsChiefWithoutChiefTask) {
  auto config = ParseTfConfig(kTwoWorkers);
  ASSERT_TRUE(config.ok());
  v1::TaskId w0;
  w0.set_type("worker");
  w0.set_index(0);
  EXPECT_EQ(*RankOf(config->cluster, w0), 0);
}

TEST(TfConfigTest, PsAndEvaluatorAreNotTrainingTasks) {
  auto config = ParseTfConfig(
      R"({"cluster": {"worker": ["w0:1"], "ps": ["p:1"], "evaluator": ["e:1"]}})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(TrainingTasks(config->cluster).size(), 1u);
  v1::TaskId ps;
  ps.set_type("ps");
  EXPECT_FALSE(RankOf(config->cluster, ps).ok());
}

// Hot spares: a "spare" job is valid TF_CONFIG (TensorFlow accepts any job
// name), trains in no rank of its own, and is out of range past its list.
TEST(TfConfigTest, SpareTasksAreKnownButNotTrainingTasks) {
  auto config = ParseTfConfig(
      R"({"cluster": {"worker": ["a:1", "b:1"], "spare": ["s:1"]},
          "task": {"type": "spare", "index": 0}})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(TrainingTasks(config->cluster).size(), 2u);
  EXPECT_TRUE(IsSpareTask(config->cluster, *config->task));
  EXPECT_FALSE(RankOf(config->cluster, *config->task).ok());
  v1::TaskId worker;
  worker.set_type("worker");
  EXPECT_FALSE(IsSpareTask(config->cluster, worker));
  auto out_of_range = ParseTfConfig(
      R"({"cluster": {"worker": ["a:1"], "spare": ["s:1"]},
          "task": {"type": "spare", "index": 1}})");
  EXPECT_FALSE(out_of_range.ok());
}

TEST(TfConfigTest, IndexAsStringIsAccepted) {
  auto config = ParseTfConfig(
      R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": "1"}})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->task->index(), 1);
}

struct InvalidCase {
  const char* name;
  const char* json;
  const char* message;
};

class TfConfigInvalidTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(TfConfigInvalidTest, IsRejectedWithAClearMessage) {
  auto config = ParseTfConfig(GetParam().json);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("TF_CONFIG"));
  EXPECT_THAT(config.status().message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Rules, TfConfigInvalidTest,
    ::testing::Values(
        InvalidCase{"NotJson", "{cluster", "not valid JSON"},
        InvalidCase{"NoCluster", R"({"task": {"type": "worker", "index": 0}})",
                    "\"cluster\" is missing"},
        InvalidCase{"EmptyCluster", R"({"cluster": {}})", "no tasks"},
        InvalidCase{"UnknownType", R"({"cluster": {"master": ["m:1"]}})",
                    "unknown task type \"master\""},
        InvalidCase{
            "TwoChiefs",
            R"({"cluster": {"chief": ["a:1", "b:1"], "worker": ["w:1"]}})",
            "at most one chief"},
        InvalidCase{
            "TwoEvaluators",
            R"({"cluster": {"worker": ["w:1"], "evaluator": ["a:1", "b:1"]}})",
            "at most one evaluator"},
        InvalidCase{
            "IndexOutOfRange",
            R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": 1}})",
            "out of range"},
        InvalidCase{
            "NegativeIndex",
            R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": -1}})",
            "non-negative integer"},
        InvalidCase{
            "TaskTypeNotInCluster",
            R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "chief", "index": 0}})",
            "out of range"},
        InvalidCase{
            "UnknownTaskType",
            R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "boss", "index": 0}})",
            "is unknown"},
        InvalidCase{"MissingTaskType",
                    R"({"cluster": {"worker": ["w:1"]}, "task": {"index": 0}})",
                    "task.type is missing"},
        InvalidCase{"AddressWithoutPort", R"({"cluster": {"worker": ["w"]}})",
                    "expected \"host:port\""},
        InvalidCase{"AddressNotString", R"({"cluster": {"worker": [7]}})",
                    "list of \"host:port\" strings"},
        InvalidCase{"OnlyPs", R"({"cluster": {"ps": ["p:1"]}})",
                    "no chief or worker task"},
        InvalidCase{"UnknownTopLevel",
                    R"({"cluster": {"worker": ["w:1"]}, "tsak": {}})",
                    "unknown top-level field"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(TfConfigTest, SameClusterIgnoresMapOrder) {
  auto a =
      ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"]}})");
  auto b =
      ParseTfConfig(R"({"cluster": {"worker": ["w:1"], "chief": ["c:1"]}})");
  auto c =
      ParseTfConfig(R"({"cluster": {"worker": ["x:1"], "chief": ["c:1"]}})");
  EXPECT_TRUE(SameCluster(a->cluster, b->cluster));
  EXPECT_FALSE(SameCluster(a->cluster, c->cluster));
}

}  // namespace
}  // namespace lockstep
