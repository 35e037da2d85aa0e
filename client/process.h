// Child processes of `lockstep local`: spawned with their output in log
// files, killed with the parent (PR_SET_PDEATHSIG), reaped by one thread that
// reports each exit, and terminated by pid (SIGTERM, then SIGKILL).
#ifndef LOCKSTEP_CLIENT_PROCESS_H_
#define LOCKSTEP_CLIENT_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lockstep::client {

class ProcessGroup {
 public:
  // Called on the reaper thread for every child that exits: its name and
  // wait status.
  using ExitCallback = std::function<void(const std::string&, int)>;

  ProcessGroup() = default;
  ~ProcessGroup();  // TerminateAll(1s)

  // Starts `argv` with `env` added to this process's environment; stderr (and
  // stdout unless `stdout_pipe`) are appended to `log_path`. With
  // `stdout_pipe`, the read end of the child's stdout is stored there. Call
  // from the main thread, or from the exit callback to restart a child:
  // PR_SET_PDEATHSIG follows the thread that forked, and both live as long
  // as the group's children.
  absl::StatusOr<pid_t> Spawn(const std::string& name,
                              const std::vector<std::string>& argv,
                              const std::vector<std::string>& env,
                              const std::string& log_path,
                              int* stdout_pipe = nullptr);

  // Starts reaping; `on_exit` runs for each exit.
  void StartReaper(ExitCallback on_exit);

  // SIGTERM to every child still running, SIGKILL to those alive after
  // `grace`, then waits for all of them.
  void TerminateAll(absl::Duration grace);

 private:
  absl::Mutex mu_;
  std::map<pid_t, std::string> running_ ABSL_GUARDED_BY(mu_);
  bool reaping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

// The last `lines` lines of a text file, for error messages.
std::string TailOfFile(const std::string& path, int lines);

}  // namespace lockstep::client

#endif  // LOCKSTEP_CLIENT_PROCESS_H_
