"""A PyTorch stand-in for an LLM server's start-up, for `cudatrace sweep` on a GPU (issue 15).

    python3 torch_kv.py [--layers 28] [--num-blocks 256] [--batch 8] [--hidden 4096]
                        [--serve PORT]

- weights: four hidden x hidden fp16 linear layers (load_weights);
- the KV cache: one tensor per layer of num_blocks blocks, each block K and V of 16 tokens x 8
  heads x 128 x fp16 = 64 KiB per layer (allocate_kv_cache): 28 layers make 1.75 MiB a block;
- a forward pass of a batch (activations, freed after);
- then prints "ready" and exits, or with --serve PORT answers HTTP on 127.0.0.1:PORT (any
  path: 200 "ok") until SIGINT or SIGTERM, as a server would.
"""

import argparse
import http.server
import signal
import sys
import threading

import torch

BLOCK_TOKENS, KV_HEADS, HEAD = 16, 8, 128


def load_weights(hidden):
    return [torch.randn(hidden, hidden, dtype=torch.float16, device="cuda") for _ in range(4)]


def allocate_kv_cache(layers, num_blocks):
    return [
        torch.zeros(2, num_blocks, BLOCK_TOKENS, KV_HEADS, HEAD, dtype=torch.float16, device="cuda")
        for _ in range(layers)
    ]


def forward(weights, batch, hidden):
    x = torch.randn(batch, 512, hidden, dtype=torch.float16, device="cuda")
    for w in weights:
        x = torch.relu(x @ w)
    torch.cuda.synchronize()
    return float(x[0, 0, 0])


def serve(port):
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok\n")

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", port), H)
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *a: stop.set())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print("serving on 127.0.0.1:%d" % port, flush=True)
    stop.wait()
    srv.shutdown()
    print("stopped", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--num-blocks", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--serve", type=int, metavar="PORT")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_kv: CUDA is not available to torch", file=sys.stderr)
        return 2
    weights = load_weights(a.hidden)
    kv = allocate_kv_cache(a.layers, a.num_blocks)
    forward(weights, a.batch, a.hidden)
    print(
        "ready: %d layers x %d blocks, batch %d; torch reserved %d bytes"
        % (a.layers, a.num_blocks, a.batch, torch.cuda.memory_reserved()),
        flush=True,
    )
    if a.serve:
        serve(a.serve)
    del kv, weights
    return 0


if __name__ == "__main__":
    sys.exit(main())
