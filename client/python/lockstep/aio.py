"""lockstep.aio: lockstep.Client on asyncio (grpc.aio), with the same calls
awaited, and Job.watch() an async iterator.

    import lockstep.aio

    async def main():
        async with lockstep.aio.Client() as client:   # LOCKSTEP_* as the CLI
            job = await client.submit("examples/fashion_mnist_cnn.json",
                                      epochs=1)
            async for update in job.watch(display=False):
                print(update.kind, update.status.step)
            final = await job.wait()

The server's identity is checked (with Python's ssl, in a thread) before
the first call and before a broken watch resumes, as lockstep.Client does.
"""
import asyncio
import os
import tempfile

import grpc

from lockstep import errors
from lockstep import metrics as metrics_lib
from lockstep._connection import Settings
from lockstep.client import (_TERMINAL, _RECONNECT_SECONDS, Update, _Display,
                             _JobFilter, _check_loadable, _load, _outcome,
                             _Receiver, _Reconnect, _SeenEvents, _updates,
                             unpack_checkpoint)
from lockstep.spec import job_spec, keyword_overrides
from lockstep.v1 import coordinator_pb2
from lockstep.v1 import coordinator_pb2_grpc

__all__ = ["Client", "Job", "Update"]


class Client:
    """A connection to a lockstep coordinator on asyncio: Client(address,
    cert, key, ca, insecure=None, timeout=30.0) as lockstep.Client, made
    inside a running event loop. The server's identity is checked at the
    first call (or `async with`): an unreachable or wrong server raises
    Unavailable or Unauthenticated there. `timeout` bounds each call."""

    def __init__(self, address=None, cert=None, key=None, ca=None, *,
                 insecure=None, timeout=30.0):
        self._settings = Settings(address, cert, key, ca, insecure)
        self.address = self._settings.address
        self.timeout = timeout
        self._checked = False
        self._channel = self._settings.channel(aio=True)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)

    async def check_server(self, timeout=None):
        """Checks the server's identity (blocking ssl, in a thread)."""
        await asyncio.to_thread(self._settings.check_server,
                                self.timeout if timeout is None else timeout)
        self._checked = True

    async def close(self):
        await self._channel.close()

    async def __aenter__(self):
        if not self._checked:
            await self.check_server()
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def __repr__(self):
        return "lockstep.aio.Client(%r)" % self.address

    async def _call(self, method, request, timeout=None):
        if not self._checked:
            await self.check_server()
        try:
            return await getattr(self._stub, method)(
                request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as error:
            raise errors.from_rpc(error, self.address) from None

    async def submit(self, spec, overrides=None, **kwargs):
        """As lockstep.Client.submit: a dict, a JSON path or a JobSpec, with
        overrides; returns the Job."""
        merged = dict(overrides or {})
        merged.update(keyword_overrides(kwargs))
        request = coordinator_pb2.SubmitJobRequest(spec=job_spec(spec, merged))
        response = await self._call("SubmitJob", request)
        return Job(self, response.job_id)

    def job(self, job_id):
        """The Job of an existing job id."""
        return Job(self, job_id)

    async def jobs(self, limit=None, state=None, owner=None, name=None):
        """The jobs' summaries, newest first; at most `limit` of those that
        match `state`, `owner` and `name` (as lockstep.Client.jobs)."""
        keep = _JobFilter(state, owner, name)
        out = []
        token = ""
        while limit is None or len(out) < limit:
            page = await self._call(
                "GetJobStatus", coordinator_pb2.GetJobStatusRequest(
                    page_token=token, page_size=1000))
            out.extend(job for job in page.jobs if keep(job))
            token = page.next_page_token
            if not token:
                break
        return out if limit is None else out[:limit]

    async def delete(self, job_id):
        """Deletes a finished job's record (as lockstep.Client.delete)."""
        await self._call("DeleteJob",
                         coordinator_pb2.DeleteJobRequest(job_id=job_id))

    async def workers(self):
        """Every registered worker, in worker id order."""
        out = []
        token = ""
        while True:
            page = await self._call(
                "ListWorkers", coordinator_pb2.ListWorkersRequest(
                    page_token=token))
            out.extend(page.workers)
            token = page.next_page_token
            if not token:
                return out

    async def queue(self):
        """The queued jobs, head first, each with why it waits."""
        response = await self._call("ListQueue",
                                    coordinator_pb2.ListQueueRequest())
        return list(response.jobs)


class Job:
    """One job of a coordinator, on asyncio."""

    def __init__(self, client, job_id):
        self.client = client
        self.id = job_id

    def __repr__(self):
        return "lockstep.aio.Job(%r)" % self.id

    async def status(self, history=False):
        """The job's JobStatus; with history=True its whole loss history."""
        if not history:
            response = await self.client._call(
                "GetJobStatus",
                coordinator_pb2.GetJobStatusRequest(job_id=self.id))
            return response.jobs[0]
        reader = metrics_lib.history_reader(self.id)
        request = next(reader)
        while True:
            response = await self.client._call("GetJobStatus", request)
            try:
                request = reader.send(response.jobs[0])
            except StopIteration as done:
                return done.value

    async def state(self):
        return metrics_lib.state_name((await self.status()).state)

    async def digest(self):
        ranks = (await self.status()).ranks
        return ranks[0].model_digest if ranks else ""

    async def stop(self):
        await self.client._call("StopJob", coordinator_pb2.StopJobRequest(
            job_id=self.id))

    async def delete(self):
        await self.client.delete(self.id)

    async def artifacts(self):
        """What the coordinator keeps of the job (Job.artifacts)."""
        response = await self.client._call(
            "ListArtifacts",
            coordinator_pb2.ListArtifactsRequest(job_id=self.id))
        return list(response.artifacts)

    async def download(self, name="model", path=None, timeout=3600):
        """Downloads the artifact `name` to `path`, checked (as
        Job.download); returns the path. The file is written in a
        thread."""
        if not self.client._checked:
            await self.client.check_server()
        call = self.client._stub.DownloadArtifact(
            coordinator_pb2.DownloadArtifactRequest(job_id=self.id,
                                                    name=name),
            timeout=timeout)
        receiver = None
        try:
            async for message in call:
                if receiver is None:
                    receiver = _Receiver(message.info,
                                         path or message.info.file_name,
                                         self.id)
                else:
                    receiver.add(message.data)  # 1 MiB: a short write
        except grpc.RpcError as error:
            if receiver is not None:
                receiver.abort()
            raise errors.from_rpc(error, self.client.address) from None
        if receiver is None:
            raise errors.DataLoss("the download of job %s's %s ended at "
                                  "once" % (self.id, name))
        return receiver.finish()

    async def download_model(self, path=None, timeout=3600):
        """Downloads the exported model (download("model"))."""
        return await self.download("model", path, timeout)

    async def download_checkpoint(self, folder, timeout=3600):
        """Downloads the last checkpoint and unpacks it into `folder` (as
        Job.download_checkpoint); returns the folder."""
        with tempfile.TemporaryDirectory(prefix="lockstep-ckpt-") as temp:
            tar = await self.download("checkpoint",
                                      os.path.join(temp, "ckpt.tar"), timeout)
            return await asyncio.to_thread(unpack_checkpoint, tar, folder,
                                           self.id)

    async def load_model(self, **sizes):
        """The exported model in PyTorch (as Job.load_model)."""
        status = await self.status()
        _check_loadable(status)
        with tempfile.TemporaryDirectory(prefix="lockstep-model-") as folder:
            path = await self.download_model(os.path.join(folder, "model.pt"))
            return await asyncio.to_thread(_load, status.spec, path, sizes)

    async def checkpoints(self):
        """The job's committed checkpoints, oldest first."""
        return list((await self.status()).checkpoints)

    async def watch(self, display=False, timeout=None,
                    reconnect_timeout=_RECONNECT_SECONDS):
        """An async iterator of Update, as lockstep.Job.watch(): a
        coordinator that goes away is tried again (its identity checked
        again) until `timeout` or `reconnect_timeout` seconds away in a
        row, and each event is yielded once."""
        reconnect = _Reconnect(self, timeout, reconnect_timeout)
        view = _Display(self.id) if display else None
        seen = _SeenEvents()
        call = None
        try:
            while True:
                error = None
                try:
                    if reconnect.away() or not self.client._checked:
                        await self.client.check_server(
                            reconnect.check_timeout())
                    call = self.client._stub.WatchJob(
                        coordinator_pb2.WatchJobRequest(job_id=self.id),
                        timeout=reconnect.remaining())
                    async for status in call:
                        reconnect.served()
                        for update in _updates(status, seen, view):
                            yield update
                        if status.state in _TERMINAL:
                            return
                except grpc.RpcError as rpc_error:
                    error = reconnect.resumable(rpc_error)
                except errors.Unavailable as unreachable:
                    error = unreachable  # the identity check's connection
                finally:
                    if call is not None:
                        call.cancel()
                await asyncio.sleep(reconnect.lost(error))
        finally:
            if view:
                view.close()
            if call is not None:
                call.cancel()

    async def wait(self, timeout=None, display=False):
        """The final JobStatus when the job succeeded; JobFailed or
        JobStopped (with .status) when it did not, DeadlineExceeded after
        `timeout` seconds."""
        final = None
        async for update in self.watch(display=display, timeout=timeout):
            final = update.status
        return _outcome(self.id, final)

    async def metrics(self):
        """The training curve as a pandas DataFrame (as Job.metrics())."""
        return metrics_lib.frame(await self.status(history=True))
