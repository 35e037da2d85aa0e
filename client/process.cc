// Spawning, reaping and terminating the child processes of `lockstep local`
// (process.h).
#include "client/process.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/files.h"

namespace lockstep::client {

ProcessGroup::~ProcessGroup() { TerminateAll(absl::Seconds(1)); }

absl::StatusOr<pid_t> ProcessGroup::Spawn(const std::string& name,
                                          const std::vector<std::string>& argv,
                                          const std::vector<std::string>& env,
                                          const std::string& log_path,
                                          int* stdout_pipe) {
  int log_fd =
      open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create log file ", log_path, ": ", strerror(errno)));
  }
  int pipe_fds[2] = {-1, -1};
  if (stdout_pipe != nullptr && pipe2(pipe_fds, O_CLOEXEC) != 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  // Everything the child needs is prepared before fork.
  std::vector<char*> c_argv;
  for (const std::string& arg : argv)
    c_argv.push_back(const_cast<char*>(arg.c_str()));
  c_argv.push_back(nullptr);
  // The environment: ours, with `env` replacing variables of the same name.
  std::vector<std::string> merged;
  for (char** var = environ; *var != nullptr; ++var) {
    absl::string_view entry(*var);
    bool replaced = false;
    for (const std::string& extra : env) {
      size_t eq = extra.find('=');
      if (entry.substr(0, entry.find('=') + 1) == extra.substr(0, eq + 1)) {
        replaced = true;
      }
    }
    if (!replaced) merged.emplace_back(entry);
  }
  merged.insert(merged.end(), env.begin(), env.end());
  std::vector<char*> c_env;
  for (const std::string& var : merged)
    c_env.push_back(const_cast<char*>(var.c_str()));
  c_env.push_back(nullptr);
  pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    // A parent that waits for signals with sigwait blocks them; the child
    // starts with none blocked, as a daemon expects.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(stdout_pipe != nullptr ? pipe_fds[1] : log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execve(c_argv[0], c_argv.data(), c_env.data());
    dprintf(STDERR_FILENO, "cannot run %s: %s\n", c_argv[0], strerror(errno));
    _exit(127);
  }
  close(log_fd);
  if (stdout_pipe != nullptr) {
    close(pipe_fds[1]);
    *stdout_pipe = pipe_fds[0];
  }
  absl::MutexLock lock(&mu_);
  running_[pid] = name;
  return pid;
}

void ProcessGroup::StartReaper(ExitCallback on_exit) {
  {
    absl::MutexLock lock(&mu_);
    reaping_ = true;
  }
  reaper_ = std::thread([this, on_exit = std::move(on_exit)] {
    while (true) {
      int status = 0;
      pid_t pid = waitpid(-1, &status, 0);
      if (pid < 0) {
        if (errno == EINTR) continue;
        break;  // ECHILD: nothing left
      }
      std::string name;
      {
        absl::MutexLock lock(&mu_);
        auto it = running_.find(pid);
        if (it == running_.end()) continue;
        name = it->second;
        running_.erase(it);
      }
      on_exit(name, status);
    }
  });
}

void ProcessGroup::TerminateAll(absl::Duration grace) {
  std::vector<pid_t> pids;
  bool reaping;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [pid, name] : running_) pids.push_back(pid);
    reaping = reaping_;
  }
  for (pid_t pid : pids) kill(pid, SIGTERM);
  if (!reaping) {
    StartReaper([](const std::string&, int) {});
  }
  {
    absl::MutexLock lock(&mu_);
    auto all_gone = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return running_.empty();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&all_gone), grace)) {
      for (const auto& [pid, name] : running_) kill(pid, SIGKILL);
    }
  }
  if (reaper_.joinable()) reaper_.join();
}

std::string TailOfFile(const std::string& path, int lines) {
  auto contents = ReadFileToString(path);
  if (!contents.ok()) return "";
  std::vector<absl::string_view> all =
      absl::StrSplit(*contents, '\n', absl::SkipEmpty());
  size_t start =
      all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + start, all.end(), "\n");
}

}  // namespace lockstep::client
