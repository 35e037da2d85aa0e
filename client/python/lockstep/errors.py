"""The typed exceptions of the lockstep client library.

Every error the library raises is a LockstepError. One that the coordinator
returned keeps its message (which names the job, the caller and what to do)
and the gRPC status code's name in `code`; the class says which it was, so
that a pipeline can catch PermissionDenied apart from InvalidArgument.
"""
import grpc


class LockstepError(Exception):
    """Base of every lockstep error. `message` is the text; `code` the gRPC
    status code's name ("INVALID_ARGUMENT", ...), or None when the library
    raised it before any call."""

    code = None

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgument(LockstepError):
    """A bad job spec, override or argument."""
    code = "INVALID_ARGUMENT"


class NotFound(LockstepError):
    """No such job (or worker)."""
    code = "NOT_FOUND"


class PermissionDenied(LockstepError):
    """The certificate's identity may not make this call (a viewer that
    submits, an operator that stops another owner's job)."""
    code = "PERMISSION_DENIED"


class Unauthenticated(LockstepError):
    """No identity the coordinator accepts, or a server that is not a
    lockstep coordinator."""
    code = "UNAUTHENTICATED"


class Unavailable(LockstepError):
    """The coordinator cannot be reached, or the TLS handshake failed."""
    code = "UNAVAILABLE"


class FailedPrecondition(LockstepError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(LockstepError):
    """A limit of the coordinator (watches, quota, queue) is reached."""
    code = "RESOURCE_EXHAUSTED"


class DataLoss(LockstepError):
    """Bytes that do not match what was declared: an artifact whose size or
    SHA-256 differs from the coordinator's record."""
    code = "DATA_LOSS"


class Aborted(LockstepError):
    code = "ABORTED"


class DeadlineExceeded(LockstepError):
    """A call or a wait ran past its timeout."""
    code = "DEADLINE_EXCEEDED"


class JobEnded(LockstepError):
    """Job.wait() on a job that ended without succeeding; `status` is its
    final JobStatus."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


class JobFailed(JobEnded):
    """The job failed (its error says why: a worker failed past
    max_restarts, a data file was corrupt, ...)."""


class JobStopped(JobEnded):
    """The job was stopped (lockstep stop, Job.stop())."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def from_rpc(error, address):
    """The typed exception for a failed call to the coordinator at
    `address`: the server's message, or for a connection that never came up
    what to check."""
    code = error.code()
    details = error.details() or ""
    cls = _BY_CODE.get(code, LockstepError)
    if code == grpc.StatusCode.UNAVAILABLE:
        details = ("cannot reach the lockstep coordinator at %s (%s): is it "
                   "running, and is the address right (LOCKSTEP_COORDINATOR)? "
                   "With TLS, its certificate must come from the CA given "
                   "(LOCKSTEP_TLS_CA) and name the host dialed"
                   % (address, details))
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED and not details:
        details = "the coordinator at %s did not answer in time" % address
    return cls(details, code.name)
