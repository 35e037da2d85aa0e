// The network test bed over tests/netbed/netbed.sh (netbed.h).
#include "tests/netbed/netbed.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace lockstep::netbed {
namespace {

struct Result {
  int code = -1;
  std::string out;  // stdout and stderr together
};

// Runs `argv` (a full path first) to completion. Its exit code travels on
// its output's last line, not through waitpid: a caller may reap every
// child itself (the chaos soak's supervisor does).
Result Run(std::vector<std::string> argv) {
  argv.insert(argv.begin(),
              {"/bin/bash", "-c", "\"$@\"; echo \"netbed-exit $?\"", "netbed"});
  Result result;
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return result;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], 1);
    dup2(pipe_fds[1], 2);
    std::vector<char*> args;
    for (const std::string& arg : argv) {
      args.push_back(const_cast<char*>(arg.c_str()));
    }
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  char buffer[4096];
  ssize_t n;
  while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) {
    result.out.append(buffer, n);
  }
  close(pipe_fds[0]);
  if (pid > 0) waitpid(pid, nullptr, 0);  // may find it reaped already
  const std::string kExit = "netbed-exit ";
  const size_t at = result.out.rfind(kExit);
  if (at != std::string::npos &&
      absl::SimpleAtoi(
          absl::StripAsciiWhitespace(
              absl::string_view(result.out).substr(at + kExit.size())),
          &result.code)) {
    result.out.erase(at);
  }
  return result;
}

// iproute2's ip, by its full path (the spawners exec without a PATH
// search), or "" when there is none.
std::string Ip() {
  for (const char* path :
       {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

// Runs the script's `command` with `args`.
Result Script(const std::string& command,
              const std::vector<std::string>& args) {
  std::vector<std::string> argv = {
      "/bin/bash", std::string(LOCKSTEP_SOURCE_DIR) + "/tests/netbed/netbed.sh",
      command};
  argv.insert(argv.end(), args.begin(), args.end());
  return Run(argv);
}

absl::Status Checked(const Result& result, absl::string_view what) {
  if (result.code == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("netbed ", what, " failed (exit ",
                                          result.code, "): ", result.out));
}

}  // namespace

std::string WhyUnavailable() {
  if (geteuid() != 0) {
    return "the network test bed needs root (ip netns, veth, bridges, tbf); "
           "skipped";
  }
  if (Ip().empty()) {
    return "the network test bed needs iproute2's ip; skipped";
  }
  return "";
}

std::string Leftovers() {
  Result found = Script("leftovers", {kPrefix});
  return found.code == 0 ? "" : found.out;
}

void RemoveLeftovers() {
  Result found = Script("leftovers", {kPrefix});
  // Lines "netns lsnbcut-h0": a bed's namespaces end in -sw or -hN, and its
  // prefix is what comes before.
  for (absl::string_view line : absl::StrSplit(found.out, '\n')) {
    if (!absl::ConsumePrefix(&line, "netns ")) continue;
    const size_t dash = line.rfind('-');
    if (dash == absl::string_view::npos) continue;
    const std::string prefix(absl::StripAsciiWhitespace(line.substr(0, dash)));
    if (absl::StartsWith(prefix, kPrefix)) Script("down", {prefix});
  }
}

absl::StatusOr<std::unique_ptr<Bed>> Bed::Up(const std::string& name,
                                             int hosts) {
  const std::string prefix = absl::StrCat(kPrefix, name);
  Result up = Script("up", {prefix, absl::StrCat(hosts)});
  if (up.code != 0) {
    Script("down", {prefix});
    return Checked(up, absl::StrCat("up ", prefix, " ", hosts));
  }
  return std::unique_ptr<Bed>(new Bed(prefix, hosts));
}

Bed::~Bed() { Script("down", {prefix_}); }

std::string Bed::Address(int host) const {
  return absl::StrCat("10.77.0.", host + 1);
}

std::string Bed::Namespace(int host) const {
  return absl::StrCat(prefix_, "-h", host);
}

std::vector<std::string> Bed::Exec(int host,
                                   const std::vector<std::string>& argv) const {
  std::vector<std::string> in = {Ip(), "netns", "exec", Namespace(host)};
  in.insert(in.end(), argv.begin(), argv.end());
  return in;
}

absl::Status Bed::Cut(int host) {
  return Checked(Script("cut", {prefix_, absl::StrCat(host)}), "cut");
}

absl::Status Bed::Heal(int host) {
  return Checked(Script("heal", {prefix_, absl::StrCat(host)}), "heal");
}

absl::Status Bed::Cap(int host, const std::string& rate) {
  return Checked(Script("cap", {prefix_, absl::StrCat(host), rate}), "cap");
}

absl::Status Bed::Uncap(int host) {
  return Checked(Script("uncap", {prefix_, absl::StrCat(host)}), "uncap");
}

}  // namespace lockstep::netbed
