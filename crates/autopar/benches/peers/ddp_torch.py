"""PyTorch DistributedDataParallel (gloo, one process per rank on this machine) training the MLP
784-512-512-10 (f32, plain SGD, cross-entropy) on a fixed random batch of `--batch` rows per rank,
for benches/versus.rs. Each rank runs one thread, as each of autopar's simulated devices does.

    python ddp_torch.py --ranks 2 --batch 64 --seconds 3

Prints one JSON object: {"torch": version, "ranks": n, "seconds_per_step": s} (rank 0's time per
step; every rank steps in lock-step through the gradient all-reduce).
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, a, init_file, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=a.ranks)
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(a.batch, 784, generator=g)
    y = torch.randint(0, 10, (a.batch,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    dist.barrier()
    # Every rank runs the same number of steps: rank 0 sizes the run from 10 probe steps and
    # broadcasts it (ranks deciding on their own clocks would leave an all-reduce waiting).
    start = time.perf_counter()
    for _ in range(10):
        step()
    total = torch.tensor([max(5, int(a.seconds / ((time.perf_counter() - start) / 10)))])
    dist.broadcast(total, 0)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(int(total.item())):
        step()
    elapsed = time.perf_counter() - start
    if rank == 0:
        with open(out + ".tmp", "w") as f:
            json.dump({"torch": torch.__version__, "ranks": a.ranks, "seconds_per_step": elapsed / int(total.item())}, f)
        os.replace(out + ".tmp", out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=3.0)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        init_file, out = os.path.join(d, "init"), os.path.join(d, "out.json")
        try:
            mp.spawn(run, args=(a, init_file, out), nprocs=a.ranks, join=True)
        except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:
            # gloo sometimes aborts a rank while tearing down ("terminate called without an
            # active exception") or raises from a closed connection there; the timing is
            # complete once rank 0 has written it (written whole: replaced into place).
            if not os.path.exists(out):
                raise
            print(f"ddp_torch.py: a rank failed after the timed steps ({e}); timing kept", file=sys.stderr)
        with open(out) as f:
            print(f.read())
