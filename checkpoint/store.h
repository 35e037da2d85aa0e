// The checkpoint folder (docs/DESIGN.md §6, docs/CHECKPOINTS.md): the files of
// the two-phase commit and the rules that keep `backup_dir` readable after a
// crash at any point.
//
//   backup_dir/
//     LATEST                       name of the newest committed checkpoint
//     ckpt-000001200/              one committed checkpoint
//       MANIFEST.json              written last: files, sizes, SHA-256
//       model.pt optimizer.pt trainer.state rank-00000.state ...
//     .tmp/worker-00001/ckpt-000001200/   a rank's prepared files
//     .tmp/ckpt-000001200.staging/        the chief assembling a checkpoint
//
// A checkpoint exists only once its folder, with a MANIFEST.json that
// verifies, has been renamed into place; LATEST is replaced atomically after
// that. No torch here: the CLI and the tests use this too.
//
// Thread-compatible; the functions touch only the paths they are given.
#ifndef LOCKSTEP_CHECKPOINT_STORE_H_
#define LOCKSTEP_CHECKPOINT_STORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lockstep/v1/checkpoint.pb.h"

namespace lockstep::checkpoint {

inline constexpr char kManifestName[] = "MANIFEST.json";
inline constexpr char kLatestName[] = "LATEST";
inline constexpr int kFormatVersion = 1;

// "ckpt-000001200".
std::string CheckpointName(int64_t step);
// ".tmp/worker-00001/ckpt-000001200", relative to backup_dir.
std::string PrepareDir(int rank, int64_t step);
// "rank-00001.state".
std::string RankStateName(int rank);

// The JSON form of the small files (trainer.state, rank-*.state, the
// manifest) and back: JsonStyle::kFile, whose bytes must not change (they are
// hashed); fields a newer lockstep added are ignored on reading. Parse errors
// are DataLoss naming `origin`.
std::string ToJson(const google::protobuf::Message& message);
absl::Status FromJson(const std::string& json, const std::string& origin,
                      google::protobuf::Message* message);

// A named blob of one checkpoint file.
using NamedFile = std::pair<std::string, std::string>;

// The prepare phase of one rank: writes `files` into backup_dir/PrepareDir()
// (replacing what an earlier attempt left there), fsyncs every file and the
// folder, and returns each file's size and SHA-256.
absl::StatusOr<std::vector<v1::CheckpointFile>> Prepare(
    const std::string& backup_dir, int rank, int64_t step,
    const std::vector<NamedFile>& files);

// One rank's prepared files, as it reported them.
struct PreparedPart {
  std::string dir;  // relative to backup_dir
  std::vector<v1::CheckpointFile> files;
};

// The commit phase, run by the chief once every rank prepared
// `manifest.step()`: moves the parts into a staging folder, checks each
// file's size and checksum, writes MANIFEST.json (the manifest given, with
// the file list filled in) last, fsyncs, renames the folder to
// ckpt-<step>, fsyncs backup_dir, then replaces LATEST. Returns the bytes
// committed. On error nothing committed earlier is touched.
absl::StatusOr<int64_t> Commit(const std::string& backup_dir,
                               v1::Manifest manifest,
                               const std::vector<PreparedPart>& parts);

// Reads a checkpoint folder's manifest and checks every file it lists:
// present, the size and the SHA-256 it records. DataLoss names what is wrong.
absl::StatusOr<v1::Manifest> Verify(const std::string& checkpoint_dir);

struct Listed {
  std::string name;  // "ckpt-000001200"
  int64_t step = 0;
  int64_t bytes = 0;      // of the files the folder holds
  absl::Status verified;  // OK or what Verify found
  v1::Manifest manifest;  // when verified
};
// Every ckpt-* folder of backup_dir, newest first, each verified.
absl::StatusOr<std::vector<Listed>> List(const std::string& backup_dir);
// The name LATEST holds; NotFound without one.
absl::StatusOr<std::string> ReadLatest(const std::string& backup_dir);

// The highest step of a ckpt-* folder, unverified (0: none): cheap enough
// for every generation start.
int64_t NewestStep(const std::string& backup_dir);

struct Found {
  std::string dir;  // full path of the checkpoint folder
  v1::Manifest manifest;
};
// The newest checkpoint after `above_step` whose manifest verifies, checking
// newest first and only as far as needed. Each newer one that does not
// verify is passed to `skipped` (name, why), as is a LATEST that names a
// missing or corrupt checkpoint. NotFound when there is none.
absl::StatusOr<Found> FindNewest(
    const std::string& backup_dir,
    const std::function<void(const std::string&, const absl::Status&)>& skipped,
    int64_t above_step = 0);

// The bytes of the file `name` of the checkpoint `found`, for a restore: read
// only when the manifest lists it, opened as a regular file without
// following a link, never more than the size the manifest records, and
// checked against the manifest's size and SHA-256 (the bytes returned are
// the bytes verified, whatever changed since Verify). DataLoss naming the
// checkpoint and the file otherwise.
absl::StatusOr<std::string> ReadCheckpointFile(const Found& found,
                                               const std::string& name);

// After the commit of `committed_step`: keeps that checkpoint and the
// `keep` - 1 before it and removes older ones, and removes temporary folders
// of steps up to `committed_step`. Newer checkpoints are left alone: they
// failed to verify at the last restore and stay for a person to inspect.
absl::Status Prune(const std::string& backup_dir, int keep,
                   int64_t committed_step);

// Removes every checkpoint, LATEST and the temporary folders: the job is
// done and its final model exported.
absl::Status RemoveAll(const std::string& backup_dir);

}  // namespace lockstep::checkpoint

#endif  // LOCKSTEP_CHECKPOINT_STORE_H_
