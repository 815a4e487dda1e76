#!/usr/bin/python3
"""The cost of calling the layer from Python, beside the same call timed in C++ (docs/python.md).

On a layer small enough that the call's fixed costs dominate, it times per call (median over rounds, each
round a median over --repeats calls, the variants interleaved so that they share the machine's state):
  native       forward + synchronize in a C++ loop (Layer.time_native)
  numpy out=   layer(x, out=y) from Python
  numpy        layer(x) (a new output array each call)
  torch out=   layer(t, out=u) with CPU float32 tensors
  bf16 out=    layer(t_bf16, out=u) (one conversion of x)
  block        MoeBlock(h) ([1, T, H] -> (out, router_logits))
and the same for a captured graph (native replay vs Graph.replay()).

  PYTHONPATH=build/python /usr/bin/python3 python/bench/overhead.py --model DIR [--tokens 1] [--workers 2]
"""
import argparse
import statistics
import time

import numpy as np

import moe_overlap as mo


def per_call_us(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1000.0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory or preset")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--schedule", default="dual")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    dev = mo.Device(workers=a.workers)
    layer = mo.Layer.from_pretrained(a.model, device=dev, max_tokens=max(a.tokens, 1))
    x = np.random.default_rng(0).standard_normal((a.tokens, layer.hidden)).astype(np.float32)
    y = np.empty_like(x)
    s = a.schedule
    variants = {
        "native": lambda: None,
        "numpy out=": lambda: layer(x, out=y, schedule=s),
        "numpy": lambda: layer(x, schedule=s),
    }
    try:
        import torch

        from moe_overlap.torch import MoeBlock
        t, u = torch.from_numpy(x.copy()), torch.empty(a.tokens, layer.hidden)
        tb = t.to(torch.bfloat16)
        block = MoeBlock(layer, schedule=s)
        h = t.view(1, a.tokens, layer.hidden)
        variants["torch out="] = lambda: layer(t, out=u, schedule=s)
        variants["bf16 out="] = lambda: layer(tb, out=u, schedule=s)
        variants["block"] = lambda: block(h)
        torch.set_num_threads(1)
    except ImportError:
        pass
    g = layer.capture(x, y, schedule=s)
    variants["graph native"] = None
    variants["graph replay()"] = g.replay
    results = {k: [] for k in variants}
    for _ in range(a.rounds):
        for name, fn in variants.items():
            if name == "native":
                us = statistics.median(layer.time_native(x, y, schedule=s, repeats=a.repeats))
            elif name == "graph native":
                us = statistics.median(layer.time_native(x, y, schedule=s, repeats=a.repeats, graph=True))
            else:
                us = per_call_us(fn, a.repeats)
            results[name].append(us)
    print(f"{layer!r}, {a.tokens} tokens, schedule {s}, {dev.workers} workers; per call, median of {a.rounds} rounds "
          f"of {a.repeats} (p10-p90 of the rounds)")
    base = {"eager": statistics.median(results["native"]), "graph": statistics.median(results["graph native"])}
    for name, r in results.items():
        q = statistics.quantiles(r, n=10)
        ref = base["graph" if name.startswith("graph") else "eager"]
        med = statistics.median(r)
        print(f"  {name:15s} {med:8.2f} us  ({q[0]:.2f}-{q[-1]:.2f})  {med - ref:+7.2f} us vs native")


if __name__ == "__main__":
    main()
