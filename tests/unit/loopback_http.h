// Plain TCP to a server on 127.0.0.1 in tests: a connected socket that
// gives up after 30 s of silence, and one whole HTTP/1.0 exchange.
#ifndef LOCKSTEP_TESTS_UNIT_LOOPBACK_HTTP_H_
#define LOCKSTEP_TESTS_UNIT_LOOPBACK_HTTP_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

namespace lockstep::testing {

// A socket connected to 127.0.0.1:port, or -1. A server that never
// answers fails the test's read instead of hanging it.
inline int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval limit{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` to 127.0.0.1:port and returns the whole response ("connect
// failed" when nothing listens).
inline std::string FetchHttp(int port, const std::string& request) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return "connect failed";
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) {
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return response;
}

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_UNIT_LOOPBACK_HTTP_H_
