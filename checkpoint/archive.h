// One committed checkpoint as a single file (issue 53): a POSIX tar (ustar)
// that the chief uploads to the coordinator when the job asks for it
// (checkpoint.upload_last), for `lockstep artifacts get JOB checkpoint`.
//
// The archive holds ckpt-<step>/ with every file its manifest lists and the
// MANIFEST.json, then a LATEST naming it: extracted into an empty folder
// (`tar -xf ckpt-000001200.tar -C DIR`) it is a backup_dir that a job
// resumes from. Each file is read as a restore reads it (ReadCheckpointFile:
// the bytes written are the bytes whose size and SHA-256 the manifest
// records), so a checkpoint damaged on disk is refused, not packed.
//
// Thread-compatible; touches only the paths it is given.
#ifndef LOCKSTEP_CHECKPOINT_ARCHIVE_H_
#define LOCKSTEP_CHECKPOINT_ARCHIVE_H_

#include <string>

#include "absl/status/status.h"
#include "checkpoint/store.h"

namespace lockstep::checkpoint {

// "ckpt-000001200.tar".
std::string ArchiveName(int64_t step);

// Writes the checkpoint `found` (FindNewest) as a tar to `path`, replacing
// what is there (mode 0600). Errors: DataLoss naming the checkpoint and the
// file when a file does not verify; InvalidArgument for a file of 8 GiB or
// more (ustar's limit); Internal when `path` cannot be written.
absl::Status WriteArchive(const Found& found, const std::string& path);

}  // namespace lockstep::checkpoint

#endif  // LOCKSTEP_CHECKPOINT_ARCHIVE_H_
