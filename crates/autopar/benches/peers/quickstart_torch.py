"""The README's quick-start job in PyTorch, in one process: the MLP 784-512-512-10 on synthetic
teacher-labelled data (x ~ N(0, 1), label = argmax of a fixed random linear map, 10 classes, a
tenth more samples held out), generated batch by batch; Momentum 0.9, linear warm-up then cosine
decay, shuffled every epoch; a loss line every `log_every` steps, one JSON metrics line per step,
evaluation on the held-out samples and a checkpoint at the end.

    python quickstart_torch.py --samples 65536 --epochs 3 --batch-size 64 --lr 0.05 \
        --warmup-steps 100 --out DIR [--threads N]

Prints `wall <seconds>` last. PyTorch runs at its defaults unless --threads is given.
"""
import argparse
import json
import math
import os
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--samples", type=int, default=65536)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--warmup-steps", type=int, default=100)
p.add_argument("--log-every", type=int, default=512)
p.add_argument("--threads", type=int, default=0)
p.add_argument("--out", default="torch-run")
a = p.parse_args()
if a.threads:
    torch.set_num_threads(a.threads)
start = time.perf_counter()
torch.manual_seed(1)
d, classes = 784, 10
teacher = torch.randn(classes, d) / math.sqrt(d)
held_out = a.samples // 10


def samples(idx):
    g = torch.Generator().manual_seed(int(idx[0]) * 7919 + len(idx))
    x = torch.randn(len(idx), d, generator=g)
    return x, (x @ teacher.T).argmax(1)


model = torch.nn.Sequential(
    torch.nn.Linear(d, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, classes)
)
opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
spe = a.samples // a.batch_size
total = spe * a.epochs


def lr_at(step):
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    progress = min((step - a.warmup_steps) / max(total - a.warmup_steps, 1), 1.0)
    return 0.5 * a.lr * (1 + math.cos(math.pi * progress))


loss_fn = torch.nn.CrossEntropyLoss()
os.makedirs(a.out, exist_ok=True)
step = 0
with open(os.path.join(a.out, "metrics.jsonl"), "w") as metrics:
    for epoch in range(a.epochs):
        order = torch.randperm(a.samples, generator=torch.Generator().manual_seed(epoch))
        for b in range(spe):
            x, y = samples(order[b * a.batch_size:(b + 1) * a.batch_size])
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            value = loss.item()
            metrics.write(json.dumps({"step": step, "epoch": epoch + 1, "loss": value, "lr": lr_at(step - 1)}) + "\n")
            if (b + 1) % a.log_every == 0:
                print(f"epoch: {epoch + 1} step: {b + 1}, loss is {value}")
with torch.no_grad():
    correct = 0
    for s in range(0, held_out, 256):
        idx = torch.arange(a.samples + s, a.samples + min(s + 256, held_out))
        x, y = samples(idx)
        correct += (model(x).argmax(1) == y).sum().item()
print(f"eval: accuracy {100 * correct / held_out:.2f}%")
torch.save(model.state_dict(), os.path.join(a.out, "mlp.pt.tmp"))
os.replace(os.path.join(a.out, "mlp.pt.tmp"), os.path.join(a.out, "mlp.pt"))
print(f"wall {time.perf_counter() - start:.3f}")
