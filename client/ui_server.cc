#include "client/ui_server.h"

#include <arpa/inet.h>
#include <google/protobuf/struct.pb.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iostream>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/commands.h"
#include "client/connection.h"

namespace lockstep::client {

// The page and its files (client/ui_page.cc).
const char* UiPageHtml();
const char* UiPageScript();
const char* UiPageStyle();

namespace {

constexpr char kUsage[] = R"(Usage: lockstep ui [--listen HOST:PORT] [--open]

Serves the web console on this machine: jobs, a job's curves and events,
the queue, the workers. It talks to the coordinator with your own
credentials (--coordinator and the TLS flags, or LOCKSTEP_*), so a viewer
certificate gives a read-only console. It prints the URL to open, with a
token that keeps other local users and other sites' pages out.

Flags:
  --listen HOST:PORT   where to serve (default 127.0.0.1:8080; port 0
                       picks a free one). Bind to loopback: anyone who can
                       reach the port and has the URL acts as you.
  --open               also open the URL in this desktop's browser
                       (xdg-open)

Examples:
  lockstep ui
  lockstep ui --listen 127.0.0.1:0
  lockstep ui --open
)";

// A POST body is at most this (the actions take none).
constexpr size_t kMaxBody = 4096;
// A request waits this long for the coordinator.
constexpr int kCallSeconds = 10;

UiResponse Error(int status, absl::string_view why) {
  google::protobuf::Struct body;
  (*body.mutable_fields())["error"].set_string_value(std::string(why));
  return {status, "application/json", ToJson(body)};
}

// A coordinator call's failure as the console answers it.
UiResponse RpcFailure(const grpc::Status& rpc, const std::string& address) {
  const absl::Status status = RpcError(rpc, address);
  switch (rpc.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return Error(503, status.message());
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return Error(403, status.message());
    case grpc::StatusCode::NOT_FOUND:
      return Error(404, status.message());
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return Error(400, status.message());
    default:
      return Error(502, status.message());
  }
}

// State of one connection across libmicrohttpd's calls: the body so far.
struct Upload {
  std::string body;
  bool too_large = false;
};

std::string Header(MHD_Connection* connection, const char* name) {
  const char* value =
      MHD_lookup_connection_value(connection, MHD_HEADER_KIND, name);
  return value != nullptr ? value : "";
}

MHD_Result Send(MHD_Connection* connection, const UiResponse& reply) {
  MHD_Response* response = MHD_create_response_from_buffer(
      reply.body.size(), const_cast<char*>(reply.body.data()),
      MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                          reply.content_type.c_str());
  // The page runs only its own script, is never framed, and the token in
  // its URL goes nowhere.
  MHD_add_response_header(response, "Content-Security-Policy",
                          "default-src 'self'; img-src 'self' data:; "
                          "frame-ancestors 'none'; form-action 'none'");
  MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(response, "Referrer-Policy", "no-referrer");
  MHD_add_response_header(response, "Cache-Control", "no-store");
  const MHD_Result queued =
      MHD_queue_response(connection, reply.status, response);
  MHD_destroy_response(response);
  return queued;
}

MHD_Result Handle(void* cls, MHD_Connection* connection, const char* url,
                  const char* method, const char* /*version*/,
                  const char* upload_data, size_t* upload_data_size,
                  void** con_cls) {
  auto* server = static_cast<UiServer*>(cls);
  if (*con_cls == nullptr) {
    *con_cls = new Upload();
    return MHD_YES;
  }
  auto* upload = static_cast<Upload*>(*con_cls);
  if (*upload_data_size > 0) {
    if (upload->body.size() + *upload_data_size > kMaxBody) {
      upload->too_large = true;
    } else {
      upload->body.append(upload_data, *upload_data_size);
    }
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (upload->too_large) {
    return Send(connection, Error(413, "the request's body is too large"));
  }
  UiRequest request;
  request.method = method;
  request.path = url;
  const char* token =
      MHD_lookup_connection_value(connection, MHD_GET_ARGUMENT_KIND, "token");
  request.query_token = token != nullptr ? token : "";
  const char* since =
      MHD_lookup_connection_value(connection, MHD_GET_ARGUMENT_KIND, "since");
  request.query_since = since != nullptr ? since : "";
  request.host = Header(connection, MHD_HTTP_HEADER_HOST);
  request.origin = Header(connection, "Origin");
  request.token = Header(connection, "X-Lockstep-Token");
  request.content_type = Header(connection, MHD_HTTP_HEADER_CONTENT_TYPE);
  return Send(connection, server->Serve(request));
}

void Completed(void* /*cls*/, MHD_Connection* /*connection*/, void** con_cls,
               MHD_RequestTerminationCode /*code*/) {
  delete static_cast<Upload*>(*con_cls);
  *con_cls = nullptr;
}

// The jobs of every page, newest first, up to `limit`.
absl::StatusOr<v1::GetJobStatusResponse> ListJobs(v1::Coordinator::Stub* stub,
                                                  int limit,
                                                  grpc::Status* failed) {
  v1::GetJobStatusResponse all;
  v1::GetJobStatusRequest request;
  do {
    request.set_page_size(std::min(limit - all.jobs_size(), 1000));
    grpc::ClientContext context;
    SetDeadline(&context, kCallSeconds);
    v1::GetJobStatusResponse page;
    *failed = stub->GetJobStatus(&context, request, &page);
    if (!failed->ok()) return absl::UnknownError("");
    for (v1::JobStatus& job : *page.mutable_jobs()) {
      *all.add_jobs() = std::move(job);
    }
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty() && all.jobs_size() < limit);
  return all;
}

// Starts the desktop's browser on `url` (xdg-open, as `jupyter notebook`
// does); where there is none, says so: the URL is printed anyway.
void OpenInBrowser(const std::string& url) {
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);  // SIGINT/TERM are blocked
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  const char* args[] = {"xdg-open", url.c_str(), nullptr};
  pid_t pid = 0;
  const int failed = posix_spawnp(&pid, "xdg-open", nullptr, &attributes,
                                  const_cast<char* const*>(args), environ);
  posix_spawnattr_destroy(&attributes);
  if (failed != 0) {
    std::cerr << "lockstep ui: --open: cannot run xdg-open ("
              << std::strerror(failed) << "); open the URL above yourself\n";
    return;
  }
  std::thread([pid] { waitpid(pid, nullptr, 0); }).detach();
}

}  // namespace

v1::JobStatus JobRow(const v1::JobStatus& job) {
  v1::JobStatus row;
  row.set_job_id(job.job_id());
  row.set_state(job.state());
  row.set_owner(job.owner());
  row.set_submitted_by(job.submitted_by());
  row.set_priority(job.priority());
  row.set_world_size(job.world_size());
  row.set_step(job.step());
  row.set_total_steps(job.total_steps());
  row.set_loss(job.loss());
  row.set_samples_per_second(job.samples_per_second());
  row.set_submit_time(job.submit_time());
  row.mutable_spec()->set_name(job.spec().name());
  row.mutable_spec()->set_num_workers(job.spec().num_workers());
  row.set_error(job.error().substr(0, kUiRowErrorBytes));
  return row;
}

std::string JobWithCurve(v1::JobStatus status, int points) {
  const int n = status.step_losses_size();
  const int64_t stride = std::max<int64_t>(1, status.loss_stride());
  const int per = std::max(1, (n + points - 1) / std::max(1, points));
  std::string steps, losses, lrs;
  for (int first = 0; first < n; first += per) {
    const int end = std::min(n, first + per);
    double loss = 0, lr = 0;
    int lr_count = 0;
    for (int i = first; i < end; ++i) {
      loss += status.step_losses(i);
      if (i < status.step_lrs_size() && std::isfinite(status.step_lrs(i))) {
        lr += status.step_lrs(i);
        ++lr_count;
      }
    }
    // The history's loss i is step i * stride + 1's.
    const int64_t step = int64_t{end - 1} * stride + 1;
    const char* sep = steps.empty() ? "" : ",";
    absl::StrAppend(&steps, sep, step);
    const double mean = loss / (end - first);
    absl::StrAppend(&losses, sep,
                    std::isfinite(mean) ? absl::StrCat(mean) : "null");
    absl::StrAppend(&lrs, sep,
                    lr_count > 0 ? absl::StrCat(lr / lr_count) : "null");
  }
  status.clear_step_losses();
  status.clear_step_lrs();
  status.clear_skipped_record_keys();
  return absl::StrCat("{\"status\":", ToJson(status), ",\"curve\":{\"steps\":[",
                      steps, "],\"loss\":[", losses, "],\"lr\":[", lrs, "]}}");
}

UiServer::UiServer(std::unique_ptr<v1::Coordinator::Stub> stub,
                   std::string address, std::string host, int port)
    : stub_(std::move(stub)),
      address_(std::move(address)),
      host_(std::move(host)),
      port_(port) {}

UiServer::~UiServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

absl::StatusOr<std::unique_ptr<UiServer>> UiServer::Start(
    const std::string& listen, std::unique_ptr<v1::Coordinator::Stub> stub,
    std::string address) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in bind_to{};
  bind_to.sin_family = AF_INET;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535 ||
      inet_pton(AF_INET, host.c_str(), &bind_to.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen \"", listen,
        "\" is not an IPv4 HOST:PORT (e.g. 127.0.0.1:8080, 127.0.0.1:0)"));
  }
  bind_to.sin_port = htons(static_cast<uint16_t>(port));
  // The socket is bound here, so that the port (when 0 was asked for), and
  // with it the gate, are known before the first request can arrive.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  if (fd < 0 ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
      bind(fd, reinterpret_cast<sockaddr*>(&bind_to), sizeof(bind_to)) != 0 ||
      ::listen(fd, 64) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat(
        "cannot serve the console on ", listen, ": ", why,
        "; is the port taken, or the address not this machine's?"));
  }
  sockaddr_in bound{};
  socklen_t size = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &size);
  port = ntohs(bound.sin_port);
  std::unique_ptr<UiServer> server(
      new UiServer(std::move(stub), std::move(address), host, port));
  const std::string at = absl::StrCat(":", port);
  std::vector<std::string> hosts = {host + at};
  if (host == "127.0.0.1") hosts.push_back("localhost" + at);
  server->gate_ = std::make_unique<UiGate>(NewUiToken(), std::move(hosts));
  if (server->gate_->token().empty()) {
    close(fd);
    return absl::InternalError("OpenSSL could not make a random token");
  }
  MHD_OptionItem options[] = {{MHD_OPTION_LISTEN_SOCKET, fd, nullptr},
                              {MHD_OPTION_CONNECTION_LIMIT, 64, nullptr},
                              {MHD_OPTION_CONNECTION_TIMEOUT, 30, nullptr},
                              {MHD_OPTION_THREAD_POOL_SIZE, 4, nullptr},
                              {MHD_OPTION_NOTIFY_COMPLETED,
                               reinterpret_cast<intptr_t>(&Completed), nullptr},
                              {MHD_OPTION_END, 0, nullptr}};
  server->daemon_ =
      MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO,
                       static_cast<uint16_t>(port), nullptr, nullptr, &Handle,
                       server.get(), MHD_OPTION_ARRAY, options, MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve the console on ", listen,
                     ": libmicrohttpd did not start"));
  }
  return server;
}

std::string UiServer::Url() const {
  return absl::StrCat("http://", host_, ":", port_, "/?token=", gate_->token());
}

UiResponse UiServer::Serve(const UiRequest& request) {
  const UiVerdict verdict = gate_->Check(request);
  if (verdict.status != 0) {
    if (absl::StartsWith(request.path, "/api/")) {
      return Error(verdict.status, verdict.why);
    }
    return {verdict.status, "text/plain; charset=utf-8", verdict.why + "\n"};
  }
  if (request.path == "/") {
    return {200, "text/html; charset=utf-8", UiPageHtml()};
  }
  if (request.path == "/app.js") {
    return {200, "text/javascript; charset=utf-8", UiPageScript()};
  }
  if (request.path == "/app.css") {
    return {200, "text/css; charset=utf-8", UiPageStyle()};
  }
  return Api(request);
}

UiResponse UiServer::Api(const UiRequest& request) {
  const std::vector<std::string> parts =
      absl::StrSplit(request.path.substr(5), '/');  // after "/api/"
  grpc::ClientContext context;
  SetDeadline(&context, kCallSeconds);
  grpc::Status rpc;
  if (parts == std::vector<std::string>{"jobs"}) {
    auto jobs = ListJobs(stub_.get(), 1000, &rpc);
    if (!jobs.ok()) return RpcFailure(rpc, address_);
    v1::GetJobStatusResponse rows;
    for (const v1::JobStatus& job : jobs->jobs())
      *rows.add_jobs() = JobRow(job);
    return {200, "application/json", ToJson(rows)};
  }
  if (parts.size() == 2 && parts[0] == "jobs") {
    const auto failure = [](const absl::Status& status) {
      return Error(absl::IsNotFound(status)      ? 404
                   : absl::IsUnavailable(status) ? 503
                                                 : 502,
                   status.message());
    };
    // A page that has drawn version V asks ?since=V: while the job has not
    // changed, its history (up to megabytes) is neither fetched nor sent.
    int64_t since = -1;
    if (!request.query_since.empty()) {
      if (!absl::SimpleAtoi(request.query_since, &since) || since < 0) {
        return Error(400, absl::StrCat("since=", request.query_since,
                                       " is not a job version"));
      }
      auto now = FetchJob(stub_.get(), address_, parts[1], /*history=*/false,
                          kCallSeconds);
      if (!now.ok()) return failure(now.status());
      if (now->version() == since) {
        return {
            200, "application/json",
            absl::StrCat("{\"unchanged\":true,\"version\":\"", since, "\"}")};
      }
    }
    auto job = FetchJob(stub_.get(), address_, parts[1], /*history=*/true,
                        kCallSeconds);
    if (!job.ok()) return failure(job.status());
    return {200, "application/json",
            JobWithCurve(*std::move(job), kUiCurvePoints)};
  }
  if (parts.size() == 3 && parts[0] == "jobs" && request.method == "POST") {
    if (parts[2] == "stop") {
      v1::StopJobRequest stop;
      stop.set_job_id(parts[1]);
      v1::StopJobResponse stopped;
      rpc = stub_->StopJob(&context, stop, &stopped);
    } else if (parts[2] == "delete") {
      v1::DeleteJobRequest remove;
      remove.set_job_id(parts[1]);
      v1::DeleteJobResponse removed;
      rpc = stub_->DeleteJob(&context, remove, &removed);
    } else {
      return Error(404, absl::StrCat(request.path, " is not an action"));
    }
    if (!rpc.ok()) return RpcFailure(rpc, address_);
    return {200, "application/json", "{}"};
  }
  if (parts == std::vector<std::string>{"queue"}) {
    v1::ListQueueRequest list;
    v1::ListQueueResponse queue;
    rpc = stub_->ListQueue(&context, list, &queue);
    if (!rpc.ok()) return RpcFailure(rpc, address_);
    return {200, "application/json", ToJson(queue)};
  }
  if (parts.size() == 2 && parts[0] == "compare") {
    v1::CompareJobsRequest compare;
    for (absl::string_view id : absl::StrSplit(parts[1], ',')) {
      if (!id.empty()) compare.add_job_ids(std::string(id));
    }
    v1::CompareJobsResponse compared;
    rpc = stub_->CompareJobs(&context, compare, &compared);
    if (!rpc.ok()) return RpcFailure(rpc, address_);
    return {200, "application/json", ToJson(compared)};
  }
  if (parts == std::vector<std::string>{"workers"}) {
    auto workers = FetchWorkers(stub_.get(), address_, kCallSeconds);
    if (!workers.ok()) {
      return Error(absl::IsUnavailable(workers.status()) ? 503 : 502,
                   workers.status().message());
    }
    v1::ListWorkersResponse all;
    for (v1::WorkerInfo& worker : *workers) *all.add_workers() = worker;
    return {200, "application/json", ToJson(all)};
  }
  return Error(404, absl::StrCat(request.path, " is not part of the API"));
}

int RunUi(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {"listen"}, {"open"}, kUsage, 0, 0, &exit);
  if (!call) return exit;
  const std::string listen = call->args.Get("listen", "127.0.0.1:8080");
  // Serves until SIGINT or SIGTERM, taken here: blocked before the
  // server's threads start, so that none of them gets it.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto server = UiServer::Start(listen, std::move(call->stub), call->address);
  if (!server.ok()) return Fail(server.status());
  std::cout << "lockstep ui: serving the console of " << call->address
            << "\nopen " << (*server)->Url() << std::endl;
  if (call->args.Has("open")) OpenInBrowser((*server)->Url());
  int received = 0;
  sigwait(&signals, &received);
  std::cout << "lockstep ui: stopped" << std::endl;
  return kExitOk;
}

}  // namespace lockstep::client
