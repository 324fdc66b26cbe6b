"""PyTorch FSDP2 (`fully_shard`, gloo, CPU) training the zoo GPT (models_torch.Gpt: the sizes of
autopar's `--model gpt`) with AdamW, one process per rank, for the memory comparison in
docs/memory.md. Launched by mpirun (rank and size from OMPI_COMM_WORLD_*) or torchrun (RANK,
WORLD_SIZE); every rank one thread. The model is built on the meta device and each rank
materialises only its shards (FSDP2's way for a model larger than one rank), each block and the
root sharded; the global batch is split over the ranks.

    mpirun -n 8 python fsdp_torch.py --gpt 256,64,2048,16,4 --batch 8 --steps 2 --init-file /tmp/fsdp-init

Prints on rank 0 one JSON object: {"torch", "ranks", "gpt", "losses", "peak_rss_bytes": [each
rank's VmHWM since its start]}.
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models_torch import Gpt  # noqa: E402


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def init_weights(model, ctx):
    """The weights each rank holds (its shards, after to_empty) given values: PyTorch's own
    initialisers per module, the token and position tables N(0, 0.02) (the token table is also
    the tied output layer), the causal masks recomputed."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.LayerNorm, nn.Embedding)):
                m.reset_parameters()
        model.wte.weight.normal_(0.0, 0.02)
        model.wpe.normal_(0.0, 0.02)
        for b in model.blocks:
            b.mask.copy_(torch.triu(torch.full((ctx, ctx), -1e9), diagonal=1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gpt", default="256,64,1024,16,4", help="vocab,context,width,heads,layers")
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences), split over the ranks")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--init-file", required=True, help="a path for gloo's file rendezvous (removed first by rank 0's launcher)")
    a = p.parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{a.init_file}", rank=rank, world_size=world)
    vocab, ctx, d, heads, layers = (int(v) for v in a.gpt.split(","))
    if a.batch % world:
        raise SystemExit(f"--batch {a.batch} does not split over {world} ranks")
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Gpt(vocab, ctx, d, heads, layers)
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    init_weights(model, ctx)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    n = a.batch // world
    losses = []
    for _ in range(a.steps):
        tokens = torch.randint(0, vocab, (a.batch, ctx), generator=g)[rank * n : (rank + 1) * n]
        labels = torch.randint(0, vocab, (a.batch * ctx,), generator=g).view(a.batch, ctx)[rank * n : (rank + 1) * n].reshape(-1)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    peaks = [None] * world
    dist.all_gather_object(peaks, peak_rss_bytes())
    if rank == 0:
        print(json.dumps({"torch": torch.__version__, "ranks": world, "gpt": a.gpt, "losses": losses, "peak_rss_bytes": peaks}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
