// The checkpoint store tests' shared fixture: the files two ranks save, a
// manifest, a fresh backup_dir per test, and a collector of skipped entries.
#ifndef LOCKSTEP_TESTS_UNIT_CHECKPOINT_STORE_FIXTURE_H_
#define LOCKSTEP_TESTS_UNIT_CHECKPOINT_STORE_FIXTURE_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/store.h"

namespace lockstep::checkpoint {

inline constexpr int kWorldSize = 2;

// What the ranks of `step` write; `variant` makes a second save of the same
// step differ from the first.
inline std::vector<NamedFile> FilesOfRank(int rank, int64_t step,
                                          int variant = 0) {
  v1::RankState rank_state;
  rank_state.set_rank(rank);
  rank_state.set_world_size(kWorldSize);
  rank_state.set_step(step);
  rank_state.set_epoch_position(step * 32 + variant);
  std::vector<NamedFile> files;
  if (rank == 0) {
    v1::TrainerState trainer;
    trainer.set_step(step);
    trainer.set_global_batch_size(64);
    trainer.set_samples_seen(step * 64);
    trainer.set_model("mlp");
    files.emplace_back("model.pt",
                       absl::StrCat("model weights of step ", step, " variant ",
                                    variant, std::string(1000, 'm')));
    files.emplace_back("optimizer.pt",
                       absl::StrCat("optimizer of step ", step, " variant ",
                                    variant, std::string(500, 'o')));
    files.emplace_back("trainer.state", ToJson(trainer));
  }
  files.emplace_back(RankStateName(rank), ToJson(rank_state));
  return files;
}

inline v1::Manifest ManifestOf(int64_t step, int epoch) {
  v1::Manifest manifest;
  manifest.set_job_id("test-1");
  manifest.set_job_name("test");
  manifest.set_step(step);
  manifest.set_epoch(epoch);
  manifest.set_generation(1);
  manifest.set_world_size(kWorldSize);
  manifest.set_global_batch_size(64);
  manifest.set_model("mlp");
  manifest.set_seed(42);
  manifest.set_time(1700000000.0);
  return manifest;
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteAll(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  ASSERT_TRUE(out.good()) << path;
}

inline void AppendByte(const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out << 'x';
  ASSERT_TRUE(out.good()) << path;
}

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmpdir = getenv("TMPDIR");
    std::string base = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
    std::string tmpl = base + "/checkpoint_store_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << tmpl;
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }

  std::string CheckpointDir(int64_t step) const {
    return dir_ + "/" + CheckpointName(step);
  }

  // Runs the prepare phase of both ranks for `step`.
  std::vector<PreparedPart> PrepareBoth(int64_t step, int variant = 0) {
    std::vector<PreparedPart> parts;
    for (int rank = 0; rank < kWorldSize; ++rank) {
      auto files = Prepare(dir_, rank, step, FilesOfRank(rank, step, variant));
      EXPECT_TRUE(files.ok()) << files.status();
      if (!files.ok()) return {};
      parts.push_back(PreparedPart{PrepareDir(rank, step), *std::move(files)});
    }
    return parts;
  }

  // Prepares and commits `step`.
  absl::StatusOr<int64_t> Save(int64_t step, int epoch = 0, int variant = 0) {
    return Commit(dir_, ManifestOf(step, epoch), PrepareBoth(step, variant));
  }

  // The names of the ckpt-* folders of dir_.
  std::set<std::string> CheckpointFolders() const {
    std::set<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      std::string name = entry.path().filename().string();
      if (name.rfind("ckpt-", 0) == 0) names.insert(name);
    }
    return names;
  }

  std::string dir_;
};

// Collects what FindNewest skipped.
struct Skipped {
  std::function<void(const std::string&, const absl::Status&)> Callback() {
    return [this](const std::string& name, const absl::Status& why) {
      entries.emplace_back(name, why);
    };
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& [name, why] : entries) names.push_back(name);
    return names;
  }
  std::vector<std::pair<std::string, absl::Status>> entries;
};

}  // namespace lockstep::checkpoint

#endif  // LOCKSTEP_TESTS_UNIT_CHECKPOINT_STORE_FIXTURE_H_
