"""PyTorch DDP (gloo) training the same models as lockstep, for
bench/ddp_compare.sh: same architecture, optimizer (Adam, lr 1e-3), global
batch, per-replica split, threads per process and system BLAS, the same
Fashion-MNIST files and normalization. Prints one line of JSON from rank 0:
{"samples_per_second": ..., "first_step_seconds": ...}; samples/s is
measured after WARMUP steps, like lockstep's training time.

  python3 bench/ddp_reference.py --workers 2 --model mlp --global-batch 128 --steps 400
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530
WARMUP = 10


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_train():
    def find(name):
        for candidate in (f"{DATA}/{name}.gz", f"{DATA}/{name}"):
            if os.path.exists(candidate):
                return candidate
        raise FileNotFoundError(name)
    images = read_idx(find("train-images-idx3-ubyte"))
    labels = read_idx(find("train-labels-idx1-ubyte"))
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))


def build(model):
    if model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                             nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def run(rank, args, start):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    images, labels = load_train()
    torch.manual_seed(args.seed)
    model = build(args.model)
    ddp = nn.parallel.DistributedDataParallel(model) if args.workers > 1 else model
    if args.compress == "fp16" and args.workers > 1:
        # PyTorch's own 16-bit wire: each bucket cast to fp16 for the
        # all-reduce (its bf16 hook needs a bf16 all-reduce, which Debian's
        # gloo does not have).
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    bf16 = args.precision == "bf16"  # autocast, as the PyTorch docs show it
    per_replica = args.global_batch // args.workers
    generator = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(images.shape[0], generator=generator)
    per_epoch = images.shape[0] // args.global_batch
    first_step = None
    for step in range(args.steps):
        if step == WARMUP:
            timed_from = time.perf_counter()
        k = step % per_epoch
        index = order[k * args.global_batch + rank * per_replica:
                      k * args.global_batch + (rank + 1) * per_replica]
        x = images[index].unsqueeze(1).float().div_(255 * STD).sub_(MEAN / STD)
        y = labels[index]
        optimizer.zero_grad()
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        if first_step is None:
            first_step = time.time() - start
    elapsed = time.perf_counter() - timed_from
    if rank == 0:
        print(json.dumps({
            "samples_per_second": (args.steps - WARMUP) * args.global_batch / elapsed,
            "first_step_seconds": first_step,
            "final_loss": float(loss),
        }), flush=True)
    if args.rank is not None:
        # One rank per host: torch 1.13's gloo can hang in its teardown
        # when the other ranks have already gone (seen with the fp16 hook on
        # the test bed); leave once every rank is done, teardown is not
        # measured.
        dist.barrier()
        os._exit(0)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--port", type=int, default=29531)
    parser.add_argument("--rank", type=int, default=None,
                        help="run only this rank, in this process (one per "
                             "host, as torchrun does); rank 0 listens at "
                             "--master")
    parser.add_argument("--master", default="127.0.0.1",
                        help="rank 0's address (MASTER_ADDR)")
    parser.add_argument("--precision", choices=["fp32", "bf16"],
                        default="fp32",
                        help="bf16: the forward pass and the loss under "
                             "torch.autocast(\"cpu\", torch.bfloat16)")
    parser.add_argument("--compress", choices=["none", "fp16"], default="none",
                        help="gradients on the wire: fp32, or fp16 through "
                             "DDP's fp16_compress_hook")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", args.master)
    os.environ["MASTER_PORT"] = str(args.port)
    start = time.time()
    if args.rank is not None:
        run(args.rank, args, start)
    else:
        mp.spawn(run, args=(args, start), nprocs=args.workers, join=True)


if __name__ == "__main__":
    main()
