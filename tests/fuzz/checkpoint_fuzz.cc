// Fuzz target: a checkpoint folder as the CLI and a restoring worker read
// it. The input is MANIFEST.json, then any number of files, each after a
// line "==> NAME <==": NAME "LATEST" goes to backup_dir, other plain names
// into backup_dir/ckpt-000000005/. The store then verifies, lists, finds
// the newest checkpoint and prunes; the state files are parsed as a restore
// parses them. A manifest that verifies must list files that are there.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "lockstep/v1/checkpoint.pb.h"
#include "tests/fuzz/fuzz_files.h"
#include "checkpoint/store.h"

namespace {

namespace checkpoint = lockstep::checkpoint;
namespace fuzz = lockstep::fuzz;

constexpr absl::string_view kStart = "==> ";
constexpr absl::string_view kEnd = " <==\n";

// Names the fuzz input may create: no separators, nothing hidden.
bool Writable(absl::string_view name) {
  if (name.empty() || name.size() > 64 || name[0] == '.') return false;
  for (char c : name) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       (c >= '0' && c <= '9') || c == '-' || c == '_' ||
                       c == '.';
    if (!plain) return false;
  }
  return true;
}

// Writes the input's manifest and files; returns the checkpoint folder.
std::string Lay(absl::string_view input, const std::string& backup) {
  const std::string ckpt = backup + "/" + checkpoint::CheckpointName(5);
  fuzz::Reset(ckpt);
  std::vector<absl::string_view> parts = absl::StrSplit(
      input, absl::ByString(std::string("\n") + std::string(kStart)));
  fuzz::WriteFile(ckpt + "/" + checkpoint::kManifestName, parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    size_t end = parts[i].find(kEnd);
    if (end == absl::string_view::npos) continue;
    absl::string_view name = parts[i].substr(0, end);
    absl::string_view body = parts[i].substr(end + kEnd.size());
    if (!Writable(name) || name == checkpoint::kManifestName) continue;
    const std::string dir = name == checkpoint::kLatestName ? backup : ckpt;
    fuzz::WriteFile(dir + "/" + std::string(name), body);
  }
  return ckpt;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string backup = fuzz::ScratchDir() + "/backup";
  fuzz::Reset(backup);
  const std::string ckpt = Lay(input, backup);

  auto manifest = checkpoint::Verify(ckpt);
  if (manifest.ok()) {
    fuzz::Check(manifest->files_size() > 0,
                "a verified manifest lists no files");
    for (const lockstep::v1::CheckpointFile& file : manifest->files()) {
      auto body = fuzz::ReadBack(ckpt + "/" + file.name());
      fuzz::Check(
          body.has_value() && static_cast<int64_t>(body->size()) == file.size(),
          "a verified file is missing or of another size");
    }
    // What a restore parses next.
    lockstep::v1::TrainerState state;
    if (auto body = fuzz::ReadBack(ckpt + "/trainer.state")) {
      (void)checkpoint::FromJson(*body, "trainer.state", &state);
    }
  }
  auto listed = checkpoint::List(backup);
  if (listed.ok()) {
    for (const checkpoint::Listed& entry : *listed) {
      fuzz::Check(entry.verified.ok() == manifest.ok(),
                  "List and Verify disagree");
    }
  }
  (void)checkpoint::ReadLatest(backup);
  (void)checkpoint::NewestStep(backup);
  auto found = checkpoint::FindNewest(
      backup, [](const std::string&, const absl::Status&) {});
  fuzz::Check(found.ok() == manifest.ok(), "FindNewest and Verify disagree");
  (void)checkpoint::Prune(backup, 1, 5);
  return 0;
}
