// lockstep: the command-line client. See README.md, "CLI reference".
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "client/commands.h"

namespace {

constexpr char kUsage[] = R"(lockstep: synchronous data-parallel training

Usage:
  lockstep local --workers N [--spares N] [--gpus] [--json] [--insecure]
                 [--threads T] [--metrics-out FILE] [--keep-logs]
                 [--set field=value ...] JOB.json
  lockstep submit JOB.json [--set field=value ...] [--watch] [--json]
  lockstep status [JOB] [--limit N | --all] [--json]
  lockstep watch JOB [--json]
  lockstep logs JOB [--follow]
  lockstep stop JOB [--json]
  lockstep delete JOB [--json]
  lockstep workers [--json]
  lockstep queue [--limit N] [--json]
  lockstep events JOB [--json]
  lockstep checkpoints JOB [--json]
  lockstep artifacts list JOB [--json] | artifacts get JOB [NAME] [-o FILE]
  lockstep metrics JOB [--csv | --json]
  lockstep compare JOB_A JOB_B ... [--svg FILE] [--json]
  lockstep health HOST:PORT [--timeout SECS] [--json]
  lockstep data inspect PATH... [--format F] | data check JOB.json
  lockstep ui [--listen HOST:PORT]
  lockstep --version

The coordinator address comes from --coordinator HOST:PORT or
$LOCKSTEP_COORDINATOR. `lockstep COMMAND --help` explains each command.

Every command but `local` talks mutual TLS: --tls-cert FILE --tls-key FILE
--tls-ca FILE (or LOCKSTEP_TLS_CERT, LOCKSTEP_TLS_KEY, LOCKSTEP_TLS_CA) give
your certificate, its key and the cluster's CA; its identity (operator/NAME
or viewer/NAME) says what you may do. --insecure (LOCKSTEP_INSECURE=1) talks
to daemons started with --insecure. `lockstep local` makes its own
certificates and prints how to point the CLI at its run.

Exit codes: 0 success, 1 the job failed or the call was refused (not
allowed, not authenticated, a cap reached), 2 usage error, 3 cannot reach
the coordinator.
)";

std::string BinaryDirectory() {
  std::string path(4096, '\0');
  ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  if (n <= 0) return ".";
  path.resize(static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lockstep::client;
  if (argc < 2) {
    std::cerr << kUsage;
    return kExitUsage;
  }
  std::string command = argv[1];
  std::vector<std::string> rest(argv + 2, argv + argc);
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << kUsage;
    return kExitOk;
  }
  if (command == "--version" || command == "version") {
    std::cout << "lockstep " << LOCKSTEP_VERSION << "\n";
    return kExitOk;
  }
  if (command == "local") return RunLocal(rest, BinaryDirectory());
  if (command == "submit") return RunSubmit(rest);
  if (command == "status") return RunStatus(rest);
  if (command == "stop") return RunStop(rest);
  if (command == "delete") return RunDelete(rest);
  if (command == "workers") return RunWorkers(rest);
  if (command == "queue") return RunQueue(rest);
  if (command == "events") return RunEvents(rest);
  if (command == "checkpoints") return RunCheckpoints(rest);
  if (command == "watch") return RunWatch(rest);
  if (command == "logs") return RunLogs(rest);
  if (command == "metrics") return RunMetrics(rest);
  if (command == "compare") return RunCompare(rest);
  if (command == "health") return RunHealth(rest);
  if (command == "data") return RunData(rest);
  if (command == "artifacts") return RunArtifacts(rest);
  if (command == "ui") return RunUi(rest);
  std::cerr << "lockstep: unknown command '" << command
            << "'; run lockstep --help\n";
  return kExitUsage;
}
