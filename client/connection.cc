// Reaching the coordinator and reporting failure for every `lockstep`
// command: address, credentials, argument handling, errors, exit codes
// (connection.h).
#include "client/connection.h"

#include <chrono>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/rpc_limits.h"
#include "common/status_macros.h"
#include "common/terminal_text.h"
#include "common/tls.h"

namespace lockstep::client {

absl::Status RpcError(const grpc::Status& status, const std::string& address) {
  absl::Status result = FromGrpcStatus(status);
  if (result.code() == absl::StatusCode::kUnavailable ||
      result.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the coordinator at ", address, " (", result.message(),
        "); is lockstep-coordinator running? Set --coordinator or "
        "LOCKSTEP_COORDINATOR. If it is, the TLS handshake may have failed: "
        "both sides' certificates must come from the same CA (--tls-ca, "
        "LOCKSTEP_TLS_CA) and the coordinator's must name the host dialed"));
  }
  return result;
}

void SetDeadline(grpc::ClientContext* context, int seconds) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(seconds));
}

absl::StatusOr<v1::JobStatus> FetchJob(v1::Coordinator::Stub* stub,
                                       const std::string& address,
                                       const std::string& job, bool history,
                                       int seconds) {
  v1::JobStatus status;
  v1::GetJobStatusRequest request;
  request.set_job_id(job);
  request.set_include_history(history);
  while (true) {
    grpc::ClientContext context;
    SetDeadline(&context, seconds);
    v1::GetJobStatusResponse response;
    grpc::Status rpc = stub->GetJobStatus(&context, request, &response);
    if (!rpc.ok()) return RpcError(rpc, address);
    if (response.jobs_size() != 1) {
      return absl::NotFoundError(absl::StrCat("no job ", job));
    }
    v1::JobStatus& page = *response.mutable_jobs(0);
    // Read before the first page is moved into `status`.
    const int64_t got = page.step_losses_size();
    const int64_t size = page.history_size();
    if (request.history_offset() == 0) {
      status = std::move(page);
    } else if (page.history_offset() != request.history_offset() ||
               page.loss_stride() != status.loss_stride()) {
      // The history was rewritten under us (a resume repeated steps, or it
      // passed 2^20 losses and was thinned): start again from its beginning.
      request.set_history_offset(0);
      continue;
    } else {
      status.mutable_step_losses()->Add(page.step_losses().begin(),
                                        page.step_losses().end());
      status.mutable_step_lrs()->Add(page.step_lrs().begin(),
                                     page.step_lrs().end());
    }
    const int64_t next = request.history_offset() + got;
    if (!history || got == 0 || next >= size) {
      status.set_history_offset(0);
      return status;
    }
    request.set_history_offset(next);
  }
}

absl::StatusOr<std::vector<v1::WorkerInfo>> FetchWorkers(
    v1::Coordinator::Stub* stub, const std::string& address, int seconds) {
  std::vector<v1::WorkerInfo> workers;
  v1::ListWorkersRequest request;
  while (true) {
    grpc::ClientContext context;
    SetDeadline(&context, seconds);
    v1::ListWorkersResponse response;
    grpc::Status rpc = stub->ListWorkers(&context, request, &response);
    if (!rpc.ok()) return RpcError(rpc, address);
    for (v1::WorkerInfo& worker : *response.mutable_workers()) {
      workers.push_back(std::move(worker));
    }
    if (response.next_page_token().empty() || response.workers_size() == 0) {
      return workers;
    }
    request.set_page_token(response.next_page_token());
  }
}

std::optional<Invocation> Begin(const std::vector<std::string>& argv,
                                std::set<std::string> value_flags,
                                std::set<std::string> bool_flags,
                                const char* usage, size_t min_positional,
                                size_t max_positional, int* exit) {
  value_flags.insert("coordinator");
  value_flags.insert(TlsValueFlags().begin(), TlsValueFlags().end());
  bool_flags.insert("help");
  bool_flags.insert(kInsecureFlag);
  auto args = Args::Parse(argv, value_flags, bool_flags);
  if (!args.ok()) {
    *exit = Fail(args.status());
    return std::nullopt;
  }
  if (args->Has("help")) {
    std::cout << usage;
    *exit = kExitOk;
    return std::nullopt;
  }
  if (args->positional().size() < min_positional ||
      args->positional().size() > max_positional) {
    std::cerr << usage;
    *exit = kExitUsage;
    return std::nullopt;
  }
  auto address = CoordinatorAddress(*args);
  if (!address.ok()) {
    *exit = Fail(address.status());
    return std::nullopt;
  }
  auto credentials = CliCredentials(*args);
  if (!credentials.ok()) {
    *exit = Fail(credentials.status());
    return std::nullopt;
  }
  Invocation invocation{*std::move(args), *address,
                        Connect(*address, *credentials)};
  return invocation;
}

int Fail(const absl::Status& status) {
  std::cerr << "lockstep: " << TerminalSafe(status.message()) << "\n";
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      return kExitUnreachable;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
      return kExitUsage;
    default:
      return kExitJobFailed;
  }
}

absl::StatusOr<std::string> CoordinatorAddress(const Args& args) {
  const char* env = std::getenv("LOCKSTEP_COORDINATOR");
  std::string address = args.Get("coordinator", env ? env : "");
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "no coordinator address: pass --coordinator HOST:PORT or set "
        "LOCKSTEP_COORDINATOR");
  }
  return address;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> CliCredentials(
    const Args& args, ServerCheck check) {
  ASSIGN_OR_RETURN(TlsOptions options, TlsOptionsFromArgsOrEnv(args));
  absl::StatusOr<TlsMaterial> material = LoadTlsMaterial(options);
  if (!material.ok()) {
    // A file the user named is a usage problem (exit 2).
    return absl::InvalidArgumentError(material.status().message());
  }
  return ChannelCredentials(*material, check);
}

std::unique_ptr<v1::Coordinator::Stub> Connect(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxRpcMessageBytes);
  args.SetMaxSendMessageSize(kMaxRpcMessageBytes);
  return v1::Coordinator::NewStub(
      grpc::CreateCustomChannel(address, std::move(credentials), args));
}

}  // namespace lockstep::client
