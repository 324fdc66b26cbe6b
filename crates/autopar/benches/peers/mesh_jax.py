"""JAX on 8 CPU devices (one process, `--xla_force_host_platform_device_count=8`) training the MLP
784-512-512-10 (f32, plain SGD, cross-entropy) on a fixed random global batch with the (2, 4)
data x model strategy of autopar's row: the batch split 2 ways, the first layer's weight split 4
ways by output column, the second's 4 ways by input row, the last replicated. XLA's SPMD
partitioner inserts the collectives. For benches/versus.rs; JAX runs at its defaults.

    python mesh_jax.py --batch 128 --seconds 3

Prints one JSON object: {"jax": version, "seconds_per_step": s}.
"""
import argparse
import json
import os
import time

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=128)
p.add_argument("--seconds", type=float, default=3.0)
a = p.parse_args()

mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "mp"))
specs = {"w1": P(None, "mp"), "b1": P("mp"), "w2": P("mp", None), "b2": P(), "w3": P(), "b3": P()}
rng = np.random.default_rng(1)


def init(fan_in, shape):
    return (rng.uniform(-1, 1, shape) / np.sqrt(fan_in)).astype(np.float32)


params = {
    "w1": init(784, (784, 512)), "b1": np.zeros(512, np.float32),
    "w2": init(512, (512, 512)), "b2": np.zeros(512, np.float32),
    "w3": init(512, (512, 10)), "b3": np.zeros(10, np.float32),
}
params = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in params.items()}
x = jax.device_put(rng.standard_normal((a.batch, 784)).astype(np.float32), NamedSharding(mesh, P("dp", None)))
y = jax.device_put(rng.integers(0, 10, a.batch).astype(np.int32), NamedSharding(mesh, P("dp")))


def loss_fn(p, x, y):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    h = jax.nn.relu(h @ p["w2"] + p["b2"])
    logits = h @ p["w3"] + p["b3"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


@jax.jit
def step(p, x, y):
    loss, g = jax.value_and_grad(loss_fn)(p, x, y)
    return {k: p[k] - 0.01 * g[k] for k in p}, loss


for _ in range(10):
    params, loss = step(params, x, y)
loss.block_until_ready()
steps, start = 0, time.perf_counter()
while steps < 5 or time.perf_counter() - start < a.seconds:
    params, loss = step(params, x, y)
    loss.block_until_ready()
    steps += 1
print(json.dumps({"jax": jax.__version__, "seconds_per_step": (time.perf_counter() - start) / steps}))
