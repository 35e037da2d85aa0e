// Where the coordinator pushes commands for one worker session.
#ifndef LOCKSTEP_COORDINATOR_SESSION_SINK_H_
#define LOCKSTEP_COORDINATOR_SESSION_SINK_H_

#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

// Send must not block (the rpc layer queues); it is called with the
// coordinator's lock held.
class SessionSink {
 public:
  virtual ~SessionSink() = default;
  virtual void Send(const v1::CoordinatorCommand& command) = 0;
  // Ends the session from the coordinator's side (a worker declared dead).
  virtual void Close() = 0;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_SESSION_SINK_H_
