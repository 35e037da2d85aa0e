"""lockstep's built-in gpt (worker/train/gpt.cc) written in plain PyTorch and
trained with DistributedDataParallel (gloo, 127.0.0.1, CPU), for
bench/lm_compare.sh.

The same model, built in the same order from the same seed (so the initial
weights come out of the same CPU generator in the same sequence): token and
position embeddings, n_layer pre-LayerNorm blocks with causal self-attention
written out (matmul, masked_fill -inf, softmax, dropout, matmul; not
scaled_dot_product_attention), an exact-GELU MLP, ln_f, logits tied to wte;
init normal(0, 0.02), the c_proj weights 0.02 / sqrt(2 n_layer), zero biases.
The same data: data.format "tokens" windows of block + 1 ids starting every
block tokens of DATA/train.bin (uint16), vocabulary = the largest id in the
windows + 1, the same per-epoch permutation of the windows (lockstep's
Feistel permutation keyed by SplitMix64, data.shuffle "global") split
across ranks the same way. The same training: cross-entropy over every position, AdamW with decay
only on the blocks' matrices (decayed group first), lockstep's LR schedule
(warmup from base_lr to the scaled LR -- with no LR scaling a constant --
then constant or cosine to min_lr over the run), gradient clipping on the
averaged gradients, dropout masks seeded per (seed, rank, step).

Validation: every window of DATA/val.bin once, split across the ranks in
contiguous shares, mean cross-entropy over all their tokens (lockstep's
test_loss). Prints one line of JSON from rank 0:
  tokens_per_second            after WARMUP steps (ddp_reference.py's rule)
  tokens_per_second_all_steps  over every step (lockstep's rule: from the
                               first step to the last, evaluation excluded)
  val_loss, final_loss (the last step's loss averaged over the ranks),
  train_seconds, eval_seconds, steps, vocab, windows.

  python3 bench/lm_ddp.py --workers 2 --threads 1 --data DIR --steps 120

--rank R --master ADDR runs one rank in this process (bench/netbed_train.sh,
one per host); --compress fp16 sends DDP's buckets as fp16.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

WARMUP = 10
MASK64 = (1 << 64) - 1


# lockstep's sampler (worker/data/sampler.cc), bit for bit.
def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def step_seed(seed, rank, step):
    state, mixed = splitmix64(seed & MASK64)
    state, mixed = splitmix64(mixed ^ rank)
    _, mixed = splitmix64(mixed ^ step)
    return mixed


def feistel_permutation(key, n):
    """lockstep's FeistelPermutation: positions 0..n-1 through a 6-round
    balanced Feistel network over the smallest even bit count covering n,
    walking again from any value outside [0, n)."""
    bits = 2
    while bits < 62 and (1 << bits) < n:
        bits += 2
    half = bits // 2
    mask = (1 << half) - 1
    state, keys = key, []
    for _ in range(6):
        state, round_key = splitmix64(state)
        keys.append(round_key)

    def encrypt(x):
        left, right = x >> half, x & mask
        for round_key in keys:
            _, mixed = splitmix64(right ^ round_key)
            left, right = right, left ^ (mixed & mask)
        return (left << half) | right

    order = []
    for p in range(n):
        x = encrypt(p)
        while x >= n:
            x = encrypt(x)
        order.append(x)
    return order


def epoch_permutation(seed, epoch, n):
    """The global shuffle's order of epoch `epoch` (GlobalSampler::EpochOrder)."""
    state = (seed ^ ((0xD6E8FEB86659FD93 * (epoch + 1)) & MASK64)) & MASK64
    _, key = splitmix64(state)
    return torch.tensor(feistel_permutation(key, n), dtype=torch.int64)


class Windows:
    """Windows of block + 1 token ids every `block` tokens of a file."""

    def __init__(self, path, block):
        tokens = np.fromfile(path, dtype="<u2")
        if tokens.size < block + 1:
            raise SystemExit(f"{path}: fewer than block + 1 = {block + 1} tokens")
        self.count = (tokens.size - (block + 1)) // block + 1
        used = (self.count - 1) * block + block + 1
        self.tokens = torch.from_numpy(tokens[:used].astype(np.int64))
        self.offsets = torch.arange(block + 1)
        self.block = block

    def batch(self, indices):
        rows = self.tokens[indices.unsqueeze(1) * self.block + self.offsets]
        return rows[:, :-1], rows[:, 1:]


class CausalSelfAttention(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.n_head = a.n_head
        self.c_attn = nn.Linear(a.n_embd, 3 * a.n_embd)
        self.c_proj = nn.Linear(a.n_embd, a.n_embd)
        self.attn_dropout = nn.Dropout(a.dropout)
        self.resid_dropout = nn.Dropout(a.dropout)
        init_linear(self.c_attn, 0.02)
        init_linear(self.c_proj, 0.02 / math.sqrt(2.0 * a.n_layer))

    def forward(self, x):
        b, t, c = x.shape
        hs = c // self.n_head
        q, k, v = self.c_attn(x).split(c, 2)
        q, k, v = (m.view(b, t, self.n_head, hs).transpose(1, 2) for m in (q, k, v))
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        # Built per call, as lockstep did before issue 37 and as a user
        # keeping DDP from broadcasting a buffer before every forward would.
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(causal.logical_not(), float("-inf"))
        att = self.attn_dropout(torch.softmax(att, -1))
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.ln_1 = nn.LayerNorm(a.n_embd)
        self.attn = CausalSelfAttention(a)
        self.ln_2 = nn.LayerNorm(a.n_embd)
        self.c_fc = nn.Linear(a.n_embd, 4 * a.n_embd)
        self.c_proj = nn.Linear(4 * a.n_embd, a.n_embd)
        self.dropout = nn.Dropout(a.dropout)
        init_linear(self.c_fc, 0.02)
        init_linear(self.c_proj, 0.02 / math.sqrt(2.0 * a.n_layer))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        h = F.gelu(self.c_fc(self.ln_2(x)))
        return x + self.dropout(self.c_proj(h))


class Gpt(nn.Module):
    def __init__(self, a, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, a.n_embd)
        self.wpe = nn.Embedding(a.block, a.n_embd)
        self.drop = nn.Dropout(a.dropout)
        self.h = nn.ModuleList([Block(a) for _ in range(a.n_layer)])
        self.ln_f = nn.LayerNorm(a.n_embd)
        with torch.no_grad():
            self.wte.weight.normal_(0.0, 0.02)
            self.wpe.weight.normal_(0.0, 0.02)

    def forward(self, tokens):
        positions = torch.arange(tokens.size(1), dtype=torch.int64)
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return torch.matmul(self.ln_f(x), self.wte.weight.t())  # tied


def init_linear(linear, std):
    with torch.no_grad():
        linear.weight.normal_(0.0, std)
        linear.bias.zero_()


def learning_rate(a, step):
    """lockstep's LrSchedule::At (no LR scaling: the scaled LR is base_lr)."""
    if step < a.warmup_steps:
        return a.lr
    if a.lr_decay == "cosine":
        span = max(1, a.steps - a.warmup_steps)
        progress = min(1.0, (step - a.warmup_steps) / span)
        return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
    return a.lr


def evaluate(model, val, rank, world, bf16, chunk=256):
    model.eval()
    begin, end = val.count * rank // world, val.count * (rank + 1) // world
    sums = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for i in range(begin, end, chunk):
            x, y = val.batch(torch.arange(i, min(end, i + chunk)))
            with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                logits = model(x)
            sums[0] += F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                       y.reshape(-1), reduction="sum").item()
            sums[1] += y.numel()
    model.train()
    dist.all_reduce(sums)
    return float(sums[0] / sums[1])


def run(rank, a):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=a.workers)
    train = Windows(os.path.join(a.data, "train.bin"), a.block)
    val = Windows(os.path.join(a.data, "val.bin"), a.block)
    vocab = int(train.tokens.max()) + 1
    if int(val.tokens.max()) >= vocab:
        raise SystemExit(f"val.bin holds token id {int(val.tokens.max())} >= vocabulary {vocab}")
    torch.manual_seed(a.seed)
    model = Gpt(a, vocab)
    decayed, kept = [], []
    for name, p in model.named_parameters():
        (decayed if p.dim() >= 2 and name not in ("wte.weight", "wpe.weight") else kept).append(p)
    ddp = nn.parallel.DistributedDataParallel(model) if a.workers > 1 else model
    if a.compress == "fp16" and a.workers > 1:
        # PyTorch's own 16-bit wire (ddp_reference.py says why not bf16).
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": a.weight_decay},
         {"params": kept, "weight_decay": 0.0}],
        lr=a.lr, betas=(a.beta1, a.beta2))
    per_replica = a.global_batch // a.workers
    per_epoch = train.count // a.global_batch
    order, order_epoch = epoch_permutation(a.seed, 0, train.count), 0
    dist.barrier()
    start = time.perf_counter()
    for step in range(a.steps):
        if step == WARMUP:
            timed_from = time.perf_counter()
        epoch, k = divmod(step, per_epoch)
        if epoch != order_epoch:
            order, order_epoch = epoch_permutation(a.seed, epoch, train.count), epoch
        first = k * a.global_batch + rank * per_replica
        x, y = train.batch(order[first:first + per_replica])
        torch.manual_seed(step_seed(a.seed, rank, step))  # dropout masks
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16, enabled=a.precision == "bf16"):
            logits = ddp(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        if a.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(a, step)
        optimizer.step()
    end = time.perf_counter()
    final = loss.detach().clone()
    dist.all_reduce(final)
    eval_start = time.perf_counter()
    val_loss = evaluate(model, val, rank, a.workers, a.precision == "bf16")
    eval_seconds = time.perf_counter() - eval_start
    tokens_per_step = a.global_batch * a.block
    if rank == 0:
        timed_steps = a.steps - WARMUP
        print(json.dumps({
            "tokens_per_second": timed_steps * tokens_per_step / (end - timed_from)
            if timed_steps > 0 else None,
            "tokens_per_second_all_steps": a.steps * tokens_per_step / (end - start),
            "val_loss": val_loss,
            "final_loss": float(final) / a.workers,
            "train_seconds": end - start,
            "eval_seconds": eval_seconds,
            "steps": a.steps,
            "vocab": vocab,
            "windows": [train.count, val.count],
        }), flush=True)
    # Leave without tearing down: destroying the DDP reducer's gloo process
    # group joins its worker thread while holding the GIL, and that thread
    # may still be freeing a tensor with a Python object, which needs the GIL
    # (PyTorch 1.13): a rank hung there, spinning, after its peer had left.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", required=True, help="directory with train.bin and val.bin (uint16)")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-decay", choices=["constant", "cosine"], default="cosine")
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--clip", type=float, default=1.0, help="clip_grad_norm; 0: none")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=29541)
    p.add_argument("--rank", type=int, default=None,
                   help="run only this rank, in this process (one per host, as "
                        "torchrun does); rank 0 listens at --master")
    p.add_argument("--master", default="127.0.0.1", help="rank 0's address (MASTER_ADDR)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: the forward pass and the loss under "
                        "torch.autocast(\"cpu\", torch.bfloat16), as nanoGPT does")
    p.add_argument("--compress", choices=["none", "fp16"], default="none",
                   help="gradients on the wire: fp32, or fp16 through DDP's fp16_compress_hook")
    a = p.parse_args()
    if a.global_batch % a.workers or a.n_embd % a.n_head:
        p.error("--global-batch must divide by --workers and --n-embd by --n-head")
    os.environ.setdefault("MASTER_ADDR", a.master)
    os.environ["MASTER_PORT"] = str(a.port)
    if a.rank is not None:
        run(a.rank, a)
    else:
        mp.spawn(run, args=(a,), nprocs=a.workers, join=True)


if __name__ == "__main__":
    main()
