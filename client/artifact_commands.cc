// `lockstep artifacts`: what the coordinator keeps of a job (its exported
// model, issue 53), listed or downloaded with its SHA-256 checked.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/connection.h"
#include "common/files.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "common/terminal_text.h"

namespace lockstep::client {
namespace {

constexpr char kArtifactsUsage[] =
    R"(Usage: lockstep artifacts list JOB [--json]
       lockstep artifacts get JOB [NAME] [-o FILE]

What the coordinator keeps of a job (lockstep-coordinator --artifact-dir):
the model the job exported (`export` in its spec), which its chief hands
over when the job succeeds. Only the job's owner, an admin or a viewer may
list and download them.

  list   the artifacts: name, file, format, step, size, SHA-256, when kept
  get    downloads NAME ("model", the default) to FILE (default: the
         export's file name, in this folder), checks its size and SHA-256,
         and moves it into place; an existing FILE is replaced only then

Examples:
  lockstep artifacts list mnist-3
  lockstep artifacts get mnist-3 -o model.pt
)";

// The command line with -o spelled as --output, which Args knows.
std::vector<std::string> WithLongFlags(std::vector<std::string> argv) {
  for (std::string& arg : argv) {
    if (arg == "-o") arg = "--output";
  }
  return argv;
}

int List(Invocation& call, const std::string& job) {
  v1::ListArtifactsRequest request;
  request.set_job_id(job);
  v1::ListArtifactsResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, 30);
  grpc::Status rpc = call.stub->ListArtifacts(&context, request, &response);
  if (!rpc.ok()) return Fail(RpcError(rpc, call.address));
  if (call.args.Has("json")) {
    std::cout << ToJson(response) << std::endl;
    return kExitOk;
  }
  if (response.artifacts().empty()) {
    std::cout << "no artifacts for " << job
              << " (the coordinator keeps a job's export when it runs with "
                 "--artifact-dir and the job succeeded)\n";
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-8s %-24s %-11s %10s %10s %-16s %s\n", "NAME",
                               "FILE", "FORMAT", "STEP", "SIZE", "SHA-256",
                               "KEPT");
  for (const v1::ArtifactInfo& info : response.artifacts()) {
    const absl::Time kept = absl::UnixEpoch() + absl::Seconds(info.time());
    std::cout << TerminalSafe(absl::StrFormat(
        "%-8s %-24s %-11s %10d %10s %-16s %s\n", info.name(), info.file_name(),
        info.format(), info.step(),
        absl::StrFormat("%.1f MB", info.bytes() / 1e6),
        info.sha256().substr(0, 16),
        absl::FormatTime("%Y-%m-%d %H:%M:%S", kept, absl::LocalTimeZone())));
  }
  return kExitOk;
}

// Downloads into a temporary file next to `out` (O_EXCL), checks it, and
// renames it over `out`. Returns the info.
absl::StatusOr<v1::ArtifactInfo> Download(Invocation& call,
                                          const std::string& job,
                                          const std::string& name,
                                          std::string out) {
  v1::DownloadArtifactRequest request;
  request.set_job_id(job);
  request.set_name(name);
  grpc::ClientContext context;
  SetDeadline(&context, 3600);
  std::unique_ptr<grpc::ClientReader<v1::ArtifactDownload>> stream =
      call.stub->DownloadArtifact(&context, request);
  v1::ArtifactDownload message;
  if (!stream->Read(&message)) {
    return RpcError(stream->Finish(), call.address);
  }
  const v1::ArtifactInfo info = message.info();
  if (out.empty()) out = info.file_name();
  if (out.empty() || out.find('\0') != std::string::npos) {
    context.TryCancel();
    stream->Finish();
    return absl::InvalidArgumentError(
        "the artifact names no file; give one with -o FILE");
  }
  const std::string temp = absl::StrFormat(
      "%s.part-%016x", out, absl::Uniform<uint64_t>(absl::BitGen()));
  const int fd = open(
      temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    context.TryCancel();
    stream->Finish();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", temp, ": ", std::strerror(errno)));
  }
  Sha256 sha;
  int64_t received = 0;
  absl::Status failed;
  while (failed.ok() && stream->Read(&message)) {
    const std::string& data = message.data();
    received += static_cast<int64_t>(data.size());
    if (received > info.bytes()) {
      failed = absl::DataLossError(absl::StrFormat(
          "the coordinator sent more than the %d bytes of artifact \"%s\" "
          "of job %s",
          info.bytes(), name, job));
      break;
    }
    sha.Update(data);
    for (size_t done = 0; done < data.size();) {
      const ssize_t n = write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        failed = absl::InternalError(
            absl::StrCat("writing ", temp, ": ", std::strerror(errno)));
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
  if (!failed.ok()) context.TryCancel();
  grpc::Status rpc = stream->Finish();
  if (failed.ok() && !rpc.ok()) failed = RpcError(rpc, call.address);
  if (failed.ok() && received != info.bytes()) {
    failed = absl::DataLossError(
        absl::StrFormat("artifact \"%s\" of job %s: %d of its %d bytes came",
                        name, job, received, info.bytes()));
  }
  if (failed.ok()) {
    absl::StatusOr<std::string> digest = sha.HexDigest();
    if (!digest.ok()) {
      failed = digest.status();
    } else if (*digest != info.sha256()) {
      failed = absl::DataLossError(
          absl::StrCat("artifact \"", name, "\" of job ", job, " has SHA-256 ",
                       *digest, " here, not the coordinator's ", info.sha256(),
                       ": it was corrupted on the way; nothing was written"));
    }
  }
  if (failed.ok() && fsync(fd) != 0) {
    failed = absl::InternalError(
        absl::StrCat("fsync ", temp, ": ", std::strerror(errno)));
  }
  close(fd);
  if (failed.ok() && rename(temp.c_str(), out.c_str()) != 0) {
    failed = absl::InternalError(absl::StrCat("renaming ", temp, " to ", out,
                                              ": ", std::strerror(errno)));
  }
  if (!failed.ok()) {
    unlink(temp.c_str());
    return failed;
  }
  const std::string folder =
      out.find('/') == std::string::npos ? "." : out.substr(0, out.rfind('/'));
  RETURN_IF_ERROR(FsyncDirectory(folder.empty() ? "/" : folder));
  return info;
}

}  // namespace

int RunArtifacts(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(WithLongFlags(argv), {"output"}, {"json"}, kArtifactsUsage,
                    2, 3, &exit);
  if (!call) return exit;
  const std::vector<std::string>& args = call->args.positional();
  const std::string& what = args[0];
  if (what == "list" && args.size() == 2) return List(*call, args[1]);
  if (what == "get") {
    const std::string name = args.size() > 2 ? args[2] : "model";
    auto info = Download(*call, args[1], name, call->args.Get("output"));
    if (!info.ok()) return Fail(info.status());
    const std::string out =
        call->args.Has("output") ? call->args.Get("output") : info->file_name();
    std::cout << TerminalSafe(absl::StrFormat(
                     "wrote %s: %s of job %s (%s, step %d, %d bytes, SHA-256 "
                     "%s checked)",
                     out, info->name(), args[1], info->format(), info->step(),
                     info->bytes(), info->sha256()))
              << std::endl;
    return kExitOk;
  }
  std::cerr << "lockstep artifacts: say list JOB or get JOB [NAME]\n"
            << kArtifactsUsage;
  return kExitUsage;
}

}  // namespace lockstep::client
