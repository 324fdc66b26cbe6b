"""PyTorch reference for benches/mlp.rs: the MLP 784-512-512-10 training step (f32, SGD) at
batch 64 on CPU with the same thread count.

    python crates/autopar-runtime/benches/mlp_torch.py [threads]
"""
import sys
import time

import torch

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)
torch.manual_seed(1)
model = torch.nn.Sequential(
    torch.nn.Linear(784, 512), torch.nn.ReLU(),
    torch.nn.Linear(512, 512), torch.nn.ReLU(),
    torch.nn.Linear(512, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 784)
y = torch.randint(0, 10, (64,))
loss_fn = torch.nn.CrossEntropyLoss()


def step():
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


for _ in range(10):
    step()
iters = 200
start = time.perf_counter()
for _ in range(iters):
    loss = step()
secs = time.perf_counter() - start
print(f"torch {torch.__version__} mlp 784-512-512-10 batch 64 f32 sgd: {iters / secs:.1f} steps/s "
      f"({1e3 * secs / iters:.3f} ms/step, {threads} threads, final loss {loss.item():.4f})")
