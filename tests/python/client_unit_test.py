#!/usr/bin/env python3
"""The lockstep Python package without a cluster (CTest: python_client_unit):
job specs and overrides, the learning-rate rule, the connection settings and
the typed errors. Runs on Debian's python3 with PYTHONPATH=build/python."""
import asyncio
import json
import math
import os
import socket
import ssl
import subprocess
import tempfile
import threading
import unittest

import grpc

import lockstep
import lockstep.aio
from lockstep import metrics
from lockstep.v1 import coordinator_pb2, job_pb2


def closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class SpecTest(unittest.TestCase):

    def test_overrides_reach_into_the_model_shorthand(self):
        spec = lockstep.job_spec({"model": "cnn"}, {"model.dropout": 0.1})
        self.assertEqual((spec.model.name, spec.model.dropout), ("cnn", 0.1))
        spec = lockstep.job_spec({"model": {"name": "mlp"}}, {"model": "resnet"})
        self.assertEqual(spec.model.name, "resnet")

    def test_dict_with_shorthand_and_overrides(self):
        spec = lockstep.job_spec(
            {"name": "m", "model": "cnn", "epochs": 2,
             "communication": {"backend": "gloo"}},
            {"epochs": 1, "communication.algorithm": "ring",
             "checkpoint.save_every_steps": 10})
        self.assertEqual(spec.model.name, "cnn")
        self.assertEqual(spec.epochs, 1)
        self.assertEqual(spec.communication.backend, "gloo")
        self.assertEqual(spec.communication.algorithm, "ring")
        self.assertEqual(spec.checkpoint.save_every_steps, 10)

    def test_file_and_message(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "job.json")
            with open(path, "w") as f:
                json.dump({"name": "f", "model": "mlp", "seed": 7,
                           "export": "/tmp/x.pt"}, f)
            spec = lockstep.job_spec(path)
        self.assertEqual((spec.name, spec.model.name, spec.seed),
                         ("f", "mlp", 7))
        self.assertEqual(spec.export_path, "/tmp/x.pt")
        again = lockstep.job_spec(spec, {"seed": 8})
        self.assertEqual((again.seed, again.export_path), (8, "/tmp/x.pt"))
        self.assertEqual(spec.seed, 7)  # the message given is not changed

    def test_bad_specs_name_the_problem(self):
        with self.assertRaisesRegex(lockstep.InvalidArgument, "no_such_field"):
            lockstep.job_spec({"no_such_field": 1})
        with self.assertRaisesRegex(lockstep.InvalidArgument, "epochs"):
            lockstep.job_spec({"epochs": "many"})
        with self.assertRaisesRegex(lockstep.InvalidArgument, "not an object"):
            lockstep.job_spec({"epochs": 1}, {"epochs.x": 2})
        with self.assertRaisesRegex(lockstep.InvalidArgument, "cannot read"):
            lockstep.job_spec("/nonexistent/job.json")
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            f.write("{not json")
            f.flush()
            with self.assertRaisesRegex(lockstep.InvalidArgument, "not JSON"):
                lockstep.job_spec(f.name)
        with self.assertRaisesRegex(lockstep.InvalidArgument, "not int"):
            lockstep.job_spec(3)


def status_with(plan, **spec):
    status = coordinator_pb2.JobStatus(spec=job_pb2.JobSpec(**spec))
    status.plan.CopyFrom(coordinator_pb2.TrainingPlan(**plan))
    return status


class FrameTest(unittest.TestCase):
    """frame() builds the table from the history the coordinator kept."""

    PLAN = dict(global_batch_size=256, base_lr=0.1, scaled_lr=0.2,
                warmup_steps=10, total_steps=110)

    def test_learning_rates_are_the_reported_ones(self):
        status = status_with(self.PLAN)
        status.step_losses.extend([3.0, 2.0, 1.0])
        status.step_lrs.extend([0.125, 0.25, 0.5])
        table = metrics.frame(status)
        self.assertEqual(list(table["lr"]), [0.125, 0.25, 0.5])

    def test_no_learning_rates_reported(self):
        # A coordinator or workers older than JobStatus.step_lrs: NaN, not
        # a guess from the spec.
        status = status_with(self.PLAN)
        status.step_losses.extend([3.0, 2.0])
        table = metrics.frame(status)
        self.assertTrue(table["lr"].isna().all())

    def test_frame_of_a_thinned_history(self):
        status = status_with(self.PLAN)
        status.job_id = "j"
        status.loss_stride = 2
        status.step_losses.extend([3.0, 2.0, 1.0])  # steps 1, 3, 5
        status.evals.add(step=4, epoch=0, test_accuracy=0.5, test_loss=1.5)
        table = metrics.frame(status)
        self.assertEqual(list(table["step"]), [1, 3, 4, 5])
        self.assertEqual(list(table["samples_seen"]), [256, 768, 1024, 1280])
        self.assertTrue(math.isnan(table["loss"][2]))
        self.assertEqual(table["test_accuracy"][2], 0.5)
        self.assertTrue(math.isnan(table["test_loss"][0]))


class HistoryTest(unittest.TestCase):
    """fetch_history pages through the history and starts over when it
    changes under it."""

    def pages(self, histories):
        """A GetJobStatus that serves `histories` (stride, losses) in turn,
        one per call, in pages of 2."""
        calls = []

        def get_status(request):
            stride, losses = histories[min(len(calls), len(histories) - 1)]
            calls.append(request.history_offset)
            start = request.history_offset
            page = coordinator_pb2.JobStatus(
                job_id="j", loss_stride=stride, history_offset=start,
                history_size=len(losses), step_losses=losses[start:start + 2],
                step_lrs=[loss / 8 for loss in losses[start:start + 2]])
            return coordinator_pb2.GetJobStatusResponse(jobs=[page])
        return get_status, calls

    def test_every_page(self):
        get_status, calls = self.pages([(1, [5.0, 4.0, 3.0, 2.0, 1.0])])
        status = metrics.fetch_history(get_status, "j")
        self.assertEqual(list(status.step_losses), [5.0, 4.0, 3.0, 2.0, 1.0])
        self.assertEqual(list(status.step_lrs),
                         [0.625, 0.5, 0.375, 0.25, 0.125])
        self.assertEqual(calls, [0, 2, 4])

    def test_a_history_thinned_or_shortened_while_read_is_read_again(self):
        long = (1, [5.0, 4.0, 3.0, 2.0, 1.0])
        thinned = (2, [5.0, 3.0, 1.0])
        get_status, calls = self.pages([long, thinned, thinned, thinned])
        status = metrics.fetch_history(get_status, "j")
        self.assertEqual(list(status.step_losses), [5.0, 3.0, 1.0])
        self.assertEqual(status.loss_stride, 2)
        self.assertEqual(calls, [0, 2, 0, 2])
        shortened = (1, [9.0, 8.0])
        get_status, calls = self.pages([long, shortened, shortened, shortened])
        self.assertEqual(list(metrics.fetch_history(get_status, "j").step_losses),
                         [9.0, 8.0])
        get_status, _ = self.pages([long, thinned, long, thinned, long, thinned])
        with self.assertRaises(lockstep.Aborted):
            metrics.fetch_history(get_status, "j")


class ConnectionTest(unittest.TestCase):

    def setUp(self):
        self.saved = {k: os.environ.pop(k) for k in list(os.environ)
                      if k.startswith("LOCKSTEP_")}

    def tearDown(self):
        os.environ.update(self.saved)

    def test_settings_errors(self):
        with self.assertRaisesRegex(lockstep.InvalidArgument,
                                    "LOCKSTEP_COORDINATOR"):
            lockstep.Client()
        with self.assertRaisesRegex(lockstep.InvalidArgument, "HOST:PORT"):
            lockstep.Client("no-port", insecure=True)
        with self.assertRaisesRegex(lockstep.InvalidArgument,
                                    "LOCKSTEP_TLS_CERT"):
            lockstep.Client("127.0.0.1:1")

    def test_unreachable_coordinator(self):
        address = "127.0.0.1:%d" % closed_port()
        os.environ["LOCKSTEP_COORDINATOR"] = address
        os.environ["LOCKSTEP_INSECURE"] = "1"
        client = lockstep.Client(timeout=5)
        with self.assertRaises(lockstep.Unavailable) as caught:
            client.jobs()
        self.assertIn(address, str(caught.exception))
        self.assertEqual(caught.exception.code, "UNAVAILABLE")

    def test_a_server_that_is_not_the_coordinator_is_refused(self):
        """A server with a certificate of the cluster's CA for the right
        host, but a worker's SPIFFE ID: the client refuses it before any
        call, as the CLI does."""
        source = os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        certs_script = os.path.join(source, "scripts", "lockstep-certs")
        with tempfile.TemporaryDirectory() as folder:
            run = lambda *a: subprocess.run(
                [certs_script, "--dir", folder] + list(a), check=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            run("operator", "alice")
            run("free-worker", "mallory", "127.0.0.1")
            path = lambda name: os.path.join(folder, name)
            server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server.load_cert_chain(path("free-mallory.crt"),
                                   path("free-mallory.key"))
            server.load_verify_locations(path("ca.crt"))
            server.verify_mode = ssl.CERT_REQUIRED
            listener = socket.create_server(("127.0.0.1", 0))
            port = listener.getsockname()[1]

            def serve_one():
                conn, _ = listener.accept()
                try:
                    with server.wrap_socket(conn, server_side=True) as tls:
                        tls.recv(1)
                except (OSError, ssl.SSLError):
                    pass

            thread = threading.Thread(target=serve_one, daemon=True)
            thread.start()
            thread2 = threading.Thread(target=serve_one, daemon=True)
            thread2.start()
            try:
                with self.assertRaises(lockstep.Unauthenticated) as caught:
                    lockstep.Client("127.0.0.1:%d" % port,
                                    path("operator-alice.crt"),
                                    path("operator-alice.key"), path("ca.crt"),
                                    timeout=10)
                # The same files given as PEM bytes: the same check.
                def read(name):
                    with open(path(name), "rb") as f:
                        return f.read()

                with self.assertRaises(lockstep.Unauthenticated) as again:
                    lockstep.Client("127.0.0.1:%d" % port,
                                    read("operator-alice.crt"),
                                    read("operator-alice.key"), read("ca.crt"),
                                    timeout=10)
            finally:
                thread.join(timeout=10)
                thread2.join(timeout=10)
                listener.close()
        self.assertIn("spiffe://lockstep/worker/mallory", str(caught.exception))
        self.assertIn("spiffe://lockstep/worker/mallory", str(again.exception))
        with self.assertRaises(lockstep.InvalidArgument) as caught:
            lockstep.Client("127.0.0.1:1", b"not a certificate", b"x", b"y")
        self.assertIn("given as bytes is not PEM data", str(caught.exception))

    def test_jobs_are_filtered_by_state_owner_and_name(self):
        pages = [coordinator_pb2.GetJobStatusResponse(
            jobs=[coordinator_pb2.JobStatus(
                job_id="a-%d" % i, owner="operator:%s" % who,
                state=coordinator_pb2.JOB_STATE_RUNNING if i % 2
                else coordinator_pb2.JOB_STATE_SUCCEEDED,
                spec=job_pb2.JobSpec(name="a" if i < 3 else "b"))
                  for i, who in enumerate(["alice", "bob", "alice", "bob"])])]

        class Paged:
            def _call(self, method, request, timeout=None):
                return pages[0]

        client = Paged()
        jobs = lambda **kw: [j.job_id for j in lockstep.Client.jobs(client, **kw)]
        self.assertEqual(jobs(), ["a-0", "a-1", "a-2", "a-3"])
        self.assertEqual(jobs(state="running"), ["a-1", "a-3"])
        self.assertEqual(jobs(state=("running", "succeeded"), owner="operator:alice"),
                         ["a-0", "a-2"])
        self.assertEqual(jobs(name="b"), ["a-3"])
        self.assertEqual(jobs(limit=1, owner="operator:bob"), ["a-1"])
        with self.assertRaises(lockstep.InvalidArgument) as caught:
            jobs(state="done")
        self.assertIn("'done'", str(caught.exception))

    def test_errors_are_lockstep_errors(self):
        with self.assertRaises(lockstep.InvalidArgument):
            lockstep.compare(["job-1", "job-2"])  # ids need client=
        result = lockstep.Comparison(None, [], [], None)
        with self.assertRaises(lockstep.FailedPrecondition):
            result.save("/tmp/unused.png")
        # A download into a folder that is not there.
        from lockstep.client import _Receiver
        info = coordinator_pb2.ArtifactInfo(bytes=0, sha256="0" * 64)
        with self.assertRaises(lockstep.FailedPrecondition) as caught:
            _Receiver(info, "/no/such/folder/model.pt", "job-1")
        self.assertIn("job-1", str(caught.exception))

    def test_state_names(self):
        self.assertEqual(lockstep.state_name(coordinator_pb2.JOB_STATE_RUNNING),
                         "running")


class _Gone(grpc.RpcError):
    """The RpcError of a coordinator that is not there."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused"


class _AwayClient:
    """A Client whose coordinator is gone: every WatchJob fails UNAVAILABLE,
    and the identity check raises `check_error` (None: it passes)."""

    def __init__(self, check_error=None):
        self.address = "127.0.0.1:1"
        self.timeout = 1.0
        self.watches = 0
        client = self

        class Settings:
            def check_server(self, timeout):
                if check_error is not None:
                    raise check_error

        class Stub:
            def WatchJob(self, request, timeout=None):
                client.watches += 1
                raise _Gone()

        self._settings = Settings()
        self._stub = Stub()


class WatchTest(unittest.TestCase):
    """Job.watch() when its coordinator goes away (issue 53 §2; the real
    restart is tests/python/watch_restart_test.py)."""

    def test_it_retries_until_its_timeout(self):
        client = _AwayClient(lockstep.Unavailable("refused", "UNAVAILABLE"))
        with self.assertRaises(lockstep.DeadlineExceeded) as caught:
            list(lockstep.Job(client, "j-1").watch(display=False, timeout=0.5))
        self.assertIn("was away for the last", str(caught.exception))
        self.assertEqual(client.watches, 1)  # then the identity check fails

    def test_without_a_timeout_it_gives_up_after_reconnect_timeout(self):
        client = _AwayClient()
        with self.assertRaises(lockstep.Unavailable) as caught:
            list(lockstep.Job(client, "j-1").watch(display=False,
                                                  reconnect_timeout=0.4))
        self.assertIn("has not served the watch of job j-1", str(caught.exception))
        self.assertGreater(client.watches, 1)

    def test_another_identity_ends_it_at_once(self):
        client = _AwayClient(lockstep.Unauthenticated("not the coordinator"))
        with self.assertRaises(lockstep.Unauthenticated):
            list(lockstep.Job(client, "j-1").watch(display=False, timeout=30))

    def test_the_async_watch_retries_as_the_other_does(self):
        client = _AwayClient(lockstep.Unavailable("refused", "UNAVAILABLE"))
        client._checked = True

        async def check_server(timeout=None):
            client._settings.check_server(timeout)

        client.check_server = check_server

        async def watch(**kwargs):
            return [u async for u in lockstep.aio.Job(client, "j-1").watch(
                **kwargs)]

        with self.assertRaises(lockstep.DeadlineExceeded):
            asyncio.run(watch(timeout=0.5))
        client = _AwayClient(lockstep.Unauthenticated("not the coordinator"))
        client._checked = True
        client.check_server = check_server
        with self.assertRaises(lockstep.Unauthenticated):
            asyncio.run(watch(timeout=30))


if __name__ == "__main__":
    unittest.main()
