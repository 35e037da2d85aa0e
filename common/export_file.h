// The job's exported model file (`export`): lockstep replaces only a file it
// exported itself, never a file someone else put at that path.
//
// A lockstep export is recognised by a small marker file beside it,
// "<export>.lockstep", that records the export's size and SHA-256: the file
// at `export` is lockstep's only while its bytes are still the ones the
// marker names. A file the user replaced, and any file lockstep never wrote
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

// OK when nothing is at `path`, or a lockstep export is. Otherwise
// FailedPrecondition naming the path and what to do: a symbolic link, a
// folder, a device or a regular file without a matching marker.
absl::Status CheckExportTarget(const std::string& path);

// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync
// of the folder) after CheckExportTarget, then its marker. A crash between
// the two leaves an export without a marker, which the next export refuses
// to replace (the error says to remove it).
absl::Status WriteExport(const std::string& path, absl::string_view bytes);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_EXPORT_FILE_H_
