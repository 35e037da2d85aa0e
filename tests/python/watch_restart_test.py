#!/usr/bin/env python3
"""A watch that outlives its coordinator (CTest: python_watch_restart, issue
53 §2): a real coordinator and two workers on 127.0.0.1 with mutual TLS
(certificates from scripts/lockstep-certs); a job is watched from Python
by lockstep.Client and by lockstep.aio while the coordinator is killed
with SIGKILL and, a second later, started again on its state folder and
port. Both watches and wait() reach the job's end, every event of the
final status was yielded, and none twice.

    LOCKSTEP_BIN_DIR=build/bin PYTHONPATH=build/python \\
        /usr/bin/python3 tests/python/watch_restart_test.py
"""
import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import lockstep
import lockstep.aio

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
MLP = os.path.join(SOURCE_DIR, "examples", "fashion_mnist_mlp.json")
BIN = os.environ.get("LOCKSTEP_BIN_DIR", os.path.join(SOURCE_DIR, "build",
                                                      "bin"))
# Long enough to be running when the coordinator dies; the workers train on
# without it until they next need it.
SPEC = {"max_steps": 3000, "epochs": 100, "warmup_steps": 0,
        "global_batch_size": 64}
WAIT_SECONDS = 240


class WatchRestartTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lockstep-watch-restart-")
        self.processes = []
        certs = os.path.join(self.dir, "certs")
        tool = os.path.join(SOURCE_DIR, "scripts", "lockstep-certs")
        for args in (["coordinator", "127.0.0.1"],
                     ["free-worker", "w0", "127.0.0.1"],
                     ["free-worker", "w1", "127.0.0.1"],
                     ["operator", "alice"]):
            subprocess.run([tool, "--dir", certs, "--days", "2"] + args,
                           check=True, capture_output=True, timeout=60)
        self.certs = certs
        self.address = self.start_coordinator("127.0.0.1:0")
        for name in ("w0", "w1"):
            self.spawn(
                [os.path.join(BIN, "lockstep-worker"), "--coordinator",
                 self.address, "--threads", "1", "--device", "cpu"] +
                self.tls("free-" + name),
                "worker-" + name,
                dict(os.environ, TF_CONFIG="", OMP_NUM_THREADS="1",
                     OPENBLAS_NUM_THREADS="1"))

    def tearDown(self):
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def tls(self, name):
        return ["--tls-cert", os.path.join(self.certs, name + ".crt"),
                "--tls-key", os.path.join(self.certs, name + ".key"),
                "--tls-ca", os.path.join(self.certs, "ca.crt")]

    def spawn(self, command, log, env=None, stdout=None):
        with open(os.path.join(self.dir, log + ".log"), "ab") as out:
            process = subprocess.Popen(
                command, stdout=stdout or out, stderr=out, env=env,
                stdin=subprocess.DEVNULL)
        self.processes.append(process)
        return process

    def start_coordinator(self, listen):
        self.coordinator = self.spawn(
            [os.path.join(BIN, "lockstep-coordinator"), "--listen", listen,
             "--state-dir", os.path.join(self.dir, "state")] +
            self.tls("coordinator"), "coordinator", stdout=subprocess.PIPE)
        line = self.coordinator.stdout.readline().decode()
        self.assertIn("listening on 127.0.0.1:", line)
        return line.split()[-1]

    def operator(self):
        return (os.path.join(self.certs, "operator-alice.crt"),
                os.path.join(self.certs, "operator-alice.key"),
                os.path.join(self.certs, "ca.crt"))

    def test_a_watch_outlives_a_coordinator_restart(self):
        client = lockstep.Client(self.address, *self.operator())
        job = client.submit(MLP, SPEC, name="watched")
        # The same job watched by lockstep.Client and by lockstep.aio.
        watches = {"sync": [], "aio": []}
        failures = []
        running = {name: threading.Event() for name in watches}

        def follow_sync():
            try:
                for update in job.watch(display=False, timeout=WAIT_SECONDS):
                    watches["sync"].append(update)
                    if update.status.step >= 20:
                        running["sync"].set()
            except Exception as error:  # pylint: disable=broad-except
                failures.append(("sync", error))
            running["sync"].set()

        async def follow_aio():
            async with lockstep.aio.Client(self.address,
                                           *self.operator()) as aio_client:
                watched = aio_client.job(job.id)
                async for update in watched.watch(timeout=WAIT_SECONDS):
                    watches["aio"].append(update)
                    if update.status.step >= 20:
                        running["aio"].set()
                final = await watched.wait(timeout=60)
                self.assertEqual(final.step, watches["aio"][-1].status.step)

        def run_aio():
            try:
                asyncio.run(follow_aio())
            except Exception as error:  # pylint: disable=broad-except
                failures.append(("aio", error))
            running["aio"].set()

        threads = [threading.Thread(target=follow_sync),
                   threading.Thread(target=run_aio)]
        for thread in threads:
            thread.start()
        for name, event in running.items():
            self.assertTrue(event.wait(WAIT_SECONDS), "%s never ran" % name)
        self.assertFalse(failures, failures)
        self.coordinator.send_signal(signal.SIGKILL)
        self.coordinator.wait()
        # Away for a second: five times what gave up before (issue 53).
        time.sleep(1.0)
        self.start_coordinator(self.address)
        for thread in threads:
            thread.join(WAIT_SECONDS)
            self.assertFalse(thread.is_alive(), "a watch did not end")
        self.assertFalse(failures, failures)
        for name, updates in watches.items():
            final = updates[-1].status
            self.assertEqual(lockstep.state_name(final.state), "succeeded",
                             "%s: %s" % (name, final.error))
            yielded = [u.event for u in updates if u.kind == "event"]
            keys = [e.SerializeToString(deterministic=True) for e in yielded]
            self.assertEqual(len(keys), len(set(keys)),
                             "%s: an event came twice" % name)
            self.assertIn("coordinator_restarted", [e.kind for e in yielded],
                          name)
            for event in final.events:
                self.assertIn(event.SerializeToString(deterministic=True),
                              keys, "%s: event %s of the final status was "
                              "not yielded" % (name, event.kind))
        # wait() on the finished job, through the restarted coordinator.
        self.assertEqual(job.wait(timeout=60).step,
                         watches["sync"][-1].status.step)
        client.close()


if __name__ == "__main__":
    unittest.main()
