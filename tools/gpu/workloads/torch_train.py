"""A small CNN trained for a few hundred steps on synthetic data: the end-to-end case of the
overhead benchmark (tools/bench_overhead.py) and a smoke test of the GPU suite.

  python3 torch_train.py [--steps 400] [--warmup 20] [--batch 256]
Prints one JSON line: {"event": "train", "steps", "seconds", "steps_per_s", "loss", ...}.
`seconds` covers the timed steps only (after the warm-up), synchronized.
"""

import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 64, 3, padding=1)
        self.c2 = nn.Conv2d(64, 128, 3, padding=1)
        self.c3 = nn.Conv2d(128, 256, 3, padding=1)
        self.fc1 = nn.Linear(256 * 4 * 4, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = F.max_pool2d(F.relu(self.c3(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def train_steps(model, opt, data, labels, steps):
    loss = None
    for i in range(steps):
        j = i % data.shape[0]
        out = model(data[j])
        loss = F.cross_entropy(out, labels[j])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    t_start = time.monotonic()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = Net().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(8, a.batch, 3, 32, 32, device=dev)
    labels = torch.randint(0, 10, (8, a.batch), device=dev)
    train_steps(model, opt, data, labels, a.warmup)
    torch.cuda.synchronize()
    t0 = time.monotonic()
    loss = train_steps(model, opt, data, labels, a.steps)
    torch.cuda.synchronize()
    t1 = time.monotonic()
    print(
        json.dumps(
            {
                "event": "train",
                "steps": a.steps,
                "batch": a.batch,
                "seconds": t1 - t0,
                "steps_per_s": a.steps / (t1 - t0),
                "setup_seconds": t0 - t_start,
                "loss": float(loss),
                "max_reserved": torch.cuda.max_memory_reserved(),
                "torch": torch.__version__,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
