"""PyTorch's training step of the MLP 784-512-512-10 (f32, plain SGD, cross-entropy) on a fixed
random batch, for benches/versus.rs. PyTorch runs at its defaults except the thread count.

    python step_torch.py --batch 64 --threads 1 --seconds 3

Prints one JSON object: {"torch": version, "seconds_per_step": s}.
"""
import argparse
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--seconds", type=float, default=3.0)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(1)
model = torch.nn.Sequential(
    torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(a.batch, 784)
y = torch.randint(0, 10, (a.batch,))
loss_fn = torch.nn.CrossEntropyLoss()


def step():
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


for _ in range(10):
    step()
steps, start = 0, time.perf_counter()
while steps < 5 or time.perf_counter() - start < a.seconds:
    step()
    steps += 1
print(json.dumps({"torch": torch.__version__, "seconds_per_step": (time.perf_counter() - start) / steps}))
