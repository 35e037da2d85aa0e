// A session sink that records what the coordinator sends a worker: the
// unit tests' and the coordinator simulation's stand-in for a session.
#ifndef LOCKSTEP_TESTS_UNIT_FAKE_SINK_H_
#define LOCKSTEP_TESTS_UNIT_FAKE_SINK_H_

#include <vector>

#include "coordinator/session_sink.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

class FakeSink : public SessionSink {
 public:
  void Send(const v1::CoordinatorCommand& command) override {
    commands.push_back(command);
  }
  void Close() override { closed = true; }
  std::vector<v1::CoordinatorCommand> commands;
  bool closed = false;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_TESTS_UNIT_FAKE_SINK_H_
