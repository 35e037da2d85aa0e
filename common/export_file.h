// The job's exported model file (`export`): lockstep replaces only a file it
// exported itself, never a file someone else put at that path.
//
// A lockstep export is recognised by a small marker file beside it,
// "<export>.lockstep", that records the job that exported it, who submitted
// that job, and the export's size and SHA-256: the file at `export` is
// lockstep's only while its bytes are still the ones the marker names, and
// only a job of the same submitter replaces it. An operator re-running a
// job replaces its own model; another operator's job cannot overwrite it.
// Under --insecure nobody has an identity, and every job is one
// submitter's. A file the user replaced, and any file lockstep never wrote
// (/etc/passwd, a model from elsewhere), is refused. The marker, not the
// model's own format, carries the mark, so the exported bytes stay exactly
// what LibTorch wrote.
//
// Thread-compatible; the functions touch only the two paths.
#ifndef LOCKSTEP_COMMON_EXPORT_FILE_H_
#define LOCKSTEP_COMMON_EXPORT_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lockstep {

// "<path>.lockstep".
std::string ExportMarkerPath(const std::string& path);

// Who exports: the job, and the identity that submitted it (the
// operator's SPIFFE ID; empty under --insecure).
struct ExportOwner {
  std::string job_id;
  std::string submitted_by;
};

// OK when nothing is at `path`, or an export of a job `owner.submitted_by`
// submitted is. Otherwise FailedPrecondition naming the path and what to
// do: a symbolic link, a folder, a device, a regular file without a
// matching marker, or another submitter's export (its job and submitter
// named).
absl::Status CheckExportTarget(const std::string& path,
                               const ExportOwner& owner);

// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync
// of the folder) after CheckExportTarget, then its marker. A crash between
// the two leaves an export without a marker, which the next export refuses
// to replace (the error says to remove it).
absl::Status WriteExport(const std::string& path, absl::string_view bytes,
                         const ExportOwner& owner);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_EXPORT_FILE_H_
