#!/usr/bin/env python3
"""Trains the Fashion-MNIST CNN on 1 and on 2 workers of a local pool,
compares the two runs and saves a plot of their curves: the notebook-style
tour of lockstep's Python client (README.md, "From Python").

    PYTHONPATH=build/python /usr/bin/python3 examples/python/compare_workers.py \\
        [--steps N] [--plot compare-workers.png]

Each cell of a notebook is one step below. Without --steps each run trains
the example's full 2 epochs.
"""
import argparse
import os
import shutil
import sys
import tempfile

import lockstep

EXAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=0,
                        help="train this many steps (0: the spec's epochs)")
    parser.add_argument("--plot", default="compare-workers.png",
                        help="where to save the figure (PNG, SVG or PDF)")
    args = parser.parse_args()
    spec = os.path.join(EXAMPLES, "fashion_mnist_cnn.json")
    overrides = {"max_steps": args.steps} if args.steps else {}

    # A coordinator and two workers on this machine (`lockstep local
    # --serve`); on a cluster, lockstep.Client() reads LOCKSTEP_COORDINATOR
    # and LOCKSTEP_TLS_* as the CLI does. The workers may export below
    # `exports`.
    exports = tempfile.mkdtemp(prefix="lockstep-tour-")
    with lockstep.LocalCluster(workers=2, export_roots=[exports]) as cluster, \
            cluster.client() as client:
        # The same job, the same global batch, on 1 and on 2 workers; the
        # first exports its model for PyTorch.
        one = client.submit(spec, overrides, num_workers=1, name="cnn-1w",
                            export=os.path.join(exports, "cnn-1w.pt"),
                            export_format="torchscript")
        two = client.submit(spec, overrides, num_workers=2, name="cnn-2w")
        for job in (one, two):
            final = job.wait(display=True)
            print("%s: %d steps, loss %.4f, test accuracy %.4f"
                  % (job.id, final.step, final.loss, final.test_accuracy))

        # Each run's curve as a DataFrame: step, samples_seen, loss, lr,
        # test metrics.
        print(two.metrics().tail())

        # Side by side: one DataFrame keyed by (job, step), a figure, and
        # whether the runs computed the same function.
        result = lockstep.compare([one, two])
        print(result.summary.T)
        for line in result.verdicts:
            print(line)
        result.save(args.plot)
        print("plot: %s" % args.plot)

        # The trained model, through the coordinator: no access to the
        # workers' disks needed (torch.jit.load gives the same module).
        model = one.load_model()
        print("model: %s with %d parameters" % (
            type(model).__name__, sum(p.numel() for p in model.parameters())))
    shutil.rmtree(exports, ignore_errors=True)
    return 0 if result.same_function() else 1


if __name__ == "__main__":
    sys.exit(main())
