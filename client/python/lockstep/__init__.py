"""lockstep from Python: submit, watch, stop and compare training jobs on a
lockstep cluster, and read their curves as pandas DataFrames.

    import lockstep
    client = lockstep.Client()            # LOCKSTEP_COORDINATOR, LOCKSTEP_TLS_*
    job = client.submit("examples/fashion_mnist_cnn.json", epochs=1)
    job.wait(display=True)
    job.metrics()                         # step, samples_seen, loss, lr, test_*

README.md ("From Python") lists the calls.
"""
from lockstep._version import __version__
from lockstep.client import Client, Job, Update
from lockstep.compare import Comparison, compare
from lockstep.errors import (Aborted, DataLoss, DeadlineExceeded,
                             FailedPrecondition,
                             InvalidArgument, JobEnded, JobFailed, JobStopped,
                             LockstepError, NotFound, PermissionDenied,
                             ResourceExhausted, Unauthenticated, Unavailable)
from lockstep.local import LocalCluster
from lockstep.metrics import state_name
from lockstep.spec import job_spec

__all__ = [
    "Aborted", "Client", "Comparison", "DataLoss", "DeadlineExceeded",
    "FailedPrecondition", "InvalidArgument", "Job", "JobEnded", "JobFailed",
    "JobStopped", "LocalCluster", "LockstepError", "NotFound",
    "PermissionDenied", "ResourceExhausted", "Unauthenticated", "Unavailable",
    "Update", "__version__", "compare", "job_spec", "state_name",
]
