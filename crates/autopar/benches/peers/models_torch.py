"""PyTorch (CPU) counterparts of the ResNet-18, GPT and Llama rows of benches/versus.rs, same sizes,
same optimizers, same thread count. The Llama is `transformers`' LlamaForCausalLM at its defaults
(its own attention implementation). Prints one JSON object per model on stdout.

usage: python models_torch.py --threads N [--models resnet18,gpt,llama] [--resnet-batch 32] [--gpt-batch 16]
       [--gpt vocab,context,width,heads,layers] [--llama-batch 16]
       [--llama vocab,context,width,heads,kv_heads,layers,ffn_width] [--seconds 10]
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes, momentum=0.1)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes, momentum=0.1)
        self.down = None
        if stride != 1 or cin != planes:
            self.down = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, 0, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (x if self.down is None else self.down(x)))


class ResNet18Cifar(nn.Module):
    def __init__(self, classes=10, width=64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        layers, cin = [], width
        for s in range(4):
            planes = width << s
            for j in range(2):
                layers.append(BasicBlock(cin, planes, 2 if s > 0 and j == 0 else 1))
                cin = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.layers(h)
        return self.fc(h.mean(dim=(2, 3)))


class Block(nn.Module):
    def __init__(self, d, heads, ctx):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d, bias=False)  # as autopar's GPT: a key bias has no effect
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), -1e9), diagonal=1))

    def forward(self, h, n, t):
        d = h.shape[-1]
        hd = d // self.heads
        a = self.ln1(h)
        split = lambda z: z.view(n, t, self.heads, hd).transpose(1, 2)
        q, k, v = split(self.q(a)), split(self.k(a)), split(self.v(a))
        s = q @ k.transpose(-1, -2) / math.sqrt(hd) + self.mask
        c = (s.softmax(-1) @ v).transpose(1, 2).reshape(n * t, d)
        h = h + self.o(c)
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, ctx, d, heads, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Parameter(torch.randn(ctx, d) * 0.02)
        self.blocks = nn.ModuleList([Block(d, heads, ctx) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)

    def forward(self, tokens):
        n, t = tokens.shape
        h = (self.wte(tokens) + self.wpe).reshape(n * t, -1)
        for b in self.blocks:
            h = b(h, n, t)
        return self.ln_f(h) @ self.wte.weight.t()  # tied LM head


def time_steps(step, seconds, min_steps=3):
    for _ in range(2):
        step()
    steps, start = 0, time.perf_counter()
    while steps < min_steps or time.perf_counter() - start < seconds:
        step()
        steps += 1
    return steps, time.perf_counter() - start


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--resnet-batch", type=int, default=32)
    p.add_argument("--gpt-batch", type=int, default=16)
    p.add_argument("--gpt", default="256,64,128,4,4", help="vocab,context,width,heads,layers")
    p.add_argument("--llama-batch", type=int, default=16)
    p.add_argument("--llama", default="256,64,128,4,2,4,344", help="vocab,context,width,heads,kv_heads,layers,ffn_width")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--models", default="resnet18,gpt", help="which models to time, comma-separated")
    a = p.parse_args()
    models = a.models.split(",")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    if "resnet18" in models:
        time_resnet(a)
    if "gpt" in models:
        time_gpt(a)
    if "llama" in models:
        time_llama(a)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)


def time_training(name, batch, net, opt, x, y, seconds):
    """Times training steps of `net` on the fixed batch (x, y) and prints the model's JSON line."""

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()

    steps, secs = time_steps(step, seconds)
    print(json.dumps({"model": name, "batch": batch, "steps": steps, "seconds": secs, "samples_per_s": batch * steps / secs}), flush=True)


def time_resnet(a):
    net = ResNet18Cifar()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.resnet_batch, 3, 32, 32)
    y = torch.randint(0, 10, (a.resnet_batch,))
    time_training("resnet18", a.resnet_batch, net, opt, x, y, a.seconds)


def time_gpt(a):
    vocab, ctx, d, heads, layers = (int(v) for v in a.gpt.split(","))
    gpt = Gpt(vocab, ctx, d, heads, layers)
    opt = torch.optim.AdamW(gpt.parameters(), lr=1e-3, weight_decay=0.0)
    tokens = torch.randint(0, vocab, (a.gpt_batch, ctx))
    labels = torch.randint(0, vocab, (a.gpt_batch * ctx,))
    time_training("gpt", a.gpt_batch, gpt, opt, tokens, labels, a.seconds)


def time_llama(a):
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, ctx, d, heads, kv_heads, layers, ffn = (int(v) for v in a.llama.split(","))
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=ctx,
                      tie_word_embeddings=False)
    lm = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-3, weight_decay=0.0)
    tokens = torch.randint(0, vocab, (a.llama_batch, ctx))
    labels = torch.randint(0, vocab, (a.llama_batch * ctx,))
    net = lambda x: lm(x).logits.reshape(-1, vocab)
    time_training("llama", a.llama_batch, net, opt, tokens, labels, a.seconds)


if __name__ == "__main__":
    main()
