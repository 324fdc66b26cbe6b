"""Reference timings for benches/kernels.rs: the same cases in PyTorch (and GEMM in numpy).

Usage: python torch_reference.py THREADS   -> lines "<engine> <case>\t<median ms>"
"""
import os
import sys
import time

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[var] = str(threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(threads)
torch.manual_seed(0)


def median_ms(iters, f):
    for _ in range(2):
        f()
    ts = []
    for _ in range(iters):
        s = time.perf_counter()
        f()
        ts.append((time.perf_counter() - s) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def emit(name, ms):
    print(f"{name}\t{ms:.4f}", flush=True)


a = np.random.rand(1024, 1024).astype(np.float32)
b = np.random.rand(1024, 1024).astype(np.float32)
emit("numpy gemm 1024x1024x1024 f32", median_ms(15, lambda: a @ b))
ta, tb = torch.from_numpy(a), torch.from_numpy(b)
emit("torch gemm 1024x1024x1024 f32", median_ms(15, lambda: ta @ tb))

model = torch.nn.Sequential(
    torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.rand(64, 784)
y = torch.tensor([(i * 7) % 10 for i in range(64)])


def step():
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()


emit("torch mlp 784-512-512-10 step, batch 64", median_ms(50, step))

# Batch 32: ResNet-18's (CIFAR stem) layers, as benches/kernels.rs lists them.
shapes = [(64, 64, 32, 3, 1), (128, 128, 16, 3, 1), (256, 256, 8, 3, 1), (512, 512, 4, 3, 1),
          (64, 128, 32, 3, 2), (128, 256, 16, 3, 2), (256, 512, 8, 3, 2), (256, 512, 8, 1, 2), (3, 64, 32, 3, 1)]
for cin, cout, hw, k, stride in shapes:
    name = f"conv2d {cin}->{cout} {k}x{k}/{stride} {hw}x{hw} b32"
    out = hw // stride
    xi = torch.rand(32, cin, hw, hw) * 2 - 1
    w = torch.randn(cout, cin, k, k) * 0.05
    dy = torch.rand(32, cout, out, out) * 2 - 1
    conv = lambda x, w: torch.nn.functional.conv2d(x, w, stride=stride, padding=k // 2)  # noqa: E731
    with torch.no_grad():
        emit(f"torch {name} forward", median_ms(7, lambda: conv(xi, w)))
    xg = xi.clone().requires_grad_(True)
    wg = w.clone().requires_grad_(True)
    y = conv(xg, wg)
    emit(f"torch   {name} dx", median_ms(5, lambda: torch.autograd.grad(y, [xg], dy, retain_graph=True)))
    emit(f"torch   {name} dw", median_ms(5, lambda: torch.autograd.grad(y, [wg], dy, retain_graph=True)))
