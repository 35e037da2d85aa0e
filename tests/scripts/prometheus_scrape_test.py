#!/usr/bin/env python3
"""A real Prometheus scrapes a real `lockstep local` run (CTest:
prometheus_scrape).

Debian's prometheus server scrapes the coordinator and both workers of a
`lockstep local --metrics-port` run on 127.0.0.1 every second; the test asks
its HTTP API, while the job trains, until it has seen the job's step rise,
both workers training (and no other worker), every target up, and the
workers' step counters and all-reduce bytes above zero. The job is long (50
epochs of the MLP) so that it outlasts the waiting on any machine; once
everything is seen the run is stopped. It fails if the job ends first, or
the answers never come within the time limit. Every process it starts is
stopped by its pid (the workers and coordinator die with `lockstep local`:
its children get SIGKILL when it exits).

    prometheus_scrape_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import prometheus_api
from prometheus_api import ready, stop

DEADLINE_SECONDS = 240


def free_ports(count):
    """`count` consecutive free ports on 127.0.0.1 (checked by binding)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        held = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no free run of %d ports on 127.0.0.1" % count)


def query(prom_port, expression):
    """The instant vector of `expression` as {labels-json: float}."""
    return {json.dumps(labels, sort_keys=True): value
            for labels, value in prometheus_api.query(prom_port, expression)}


def main():
    bin_dir, source_dir = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="lockstep-prometheus-")
    base = free_ports(4)  # coordinator, 2 workers, Prometheus
    prom_port = base + 3
    with open(os.path.join(work, "prometheus.yml"), "w") as config:
        config.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: lockstep-coordinator
    static_configs: [{{targets: ["127.0.0.1:{base}"]}}]
  - job_name: lockstep-worker
    static_configs: [{{targets: ["127.0.0.1:{base + 1}", "127.0.0.1:{base + 2}"]}}]
""")
    prometheus = local = None
    prom_log = open(os.path.join(work, "prometheus.log"), "w")
    local_log = open(os.path.join(work, "local.log"), "w")
    # What Prometheus has shown at some point of the run.
    seen = {name: False for name in (
        "step rose", "2 workers training, 2 registered", "3 targets up",
        "both workers count steps", "both workers count all-reduce bytes")}

    def note(name, now):
        seen[name] = seen[name] or now
    try:
        prometheus = subprocess.Popen(
            ["prometheus", "--config.file=" + os.path.join(work, "prometheus.yml"),
             "--storage.tsdb.path=" + os.path.join(work, "data"),
             "--web.listen-address=127.0.0.1:%d" % prom_port],
            stdout=prom_log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not ready(prom_port):
            if prometheus.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("prometheus did not become ready; its log:\n"
                                   + open(prom_log.name).read()[-3000:])
            time.sleep(0.2)

        local = subprocess.Popen(
            [os.path.join(bin_dir, "lockstep"), "local", "--workers", "2",
             "--metrics-port", str(base), "--set", "epochs=50",
             "examples/fashion_mnist_mlp.json"],
            cwd=source_dir, stdout=local_log, stderr=subprocess.STDOUT)
        steps = []
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            step = query(prom_port, "lockstep_job_step")
            if step:
                value = max(step.values())
                if not steps or steps[-1] != value:
                    steps.append(value)
            note("step rose", len(steps) >= 2 and steps[-1] > steps[0])
            training = query(prom_port, 'lockstep_workers{state="training"}')
            workers = query(prom_port, "sum(lockstep_workers)")
            note("2 workers training, 2 registered",
                 2.0 in training.values() and list(workers.values()) == [2.0])
            note("3 targets up", len(query(prom_port, "up == 1")) == 3)
            note("both workers count steps",
                 len(query(prom_port, "lockstep_worker_steps_total > 0")) == 2)
            note("both workers count all-reduce bytes",
                 len(query(prom_port, 'lockstep_worker_collective_bytes_total'
                                      '{op="allreduce"} > 0')) == 2)
            if all(seen.values()):
                break
            if local.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the job ended (or time ran out) before Prometheus saw "
                    "everything (seen so far: %s); steps seen %s; lockstep local's output:\n%s"
                    % (seen, steps, open(local_log.name).read()[-3000:]))
            time.sleep(0.5)
        print("prometheus scrape: OK (%s; the step seen at %d values, "
              "%d to %d)" % (", ".join(seen), len(steps), steps[0], steps[-1]))
        return 0
    except Exception as error:  # pylint: disable=broad-except
        print("prometheus scrape: FAILED: %s" % error)
        return 1
    finally:
        stop(local)
        stop(prometheus)
        prom_log.close()
        local_log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
