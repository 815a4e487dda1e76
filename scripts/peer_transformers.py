#!/usr/bin/python3
"""The peer a user would otherwise pick: the MoE block as Hugging Face transformers runs it in PyTorch eager
mode on the CPU (Qwen2MoeSparseMoeBlock / Qwen3NextSparseMoeBlock, DeepseekV3MoE and its relatives), on a
checkpoint directory written by `moe-overlap make-checkpoint` (or any real one).

It reproduces transformers' forward line for line (router linear, softmax or sigmoid+bias routing, the loop
over hit experts with index_add_, the shared expert and its sigmoid gate) in the checkpoint dtype, and times
it the way `moe-overlap bench` does: a new random input every repetition, median and spread.

  /usr/bin/python3 scripts/peer_transformers.py --model DIR [--layer L] [--tokens 1,8,32] [--repeats 20]
      [--threads 2] [--input x.npy --output y.npy]

Uses Debian's python3-torch and python3-numpy (scripts/install-deps.sh installs them). The Python tests
(python/tests) import it to check moe_overlap.torch.MoeBlock against it.
"""
import argparse
import json
import os
import statistics
import struct
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

# The weights are read-only views of the mapped checkpoint, as in moe-overlap; nothing here writes them.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

DTYPES = {"BF16": (np.uint16, torch.bfloat16), "F32": (np.float32, torch.float32), "F16": (np.float16, torch.float16)}


class Checkpoint:
    """Memory-maps safetensors shards (no copy); tensors come back as torch tensors viewing the mapping."""

    def __init__(self, model_dir):
        self.dir = model_dir
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                self.where = json.load(f)["weight_map"]
        else:
            self.where = None
        self.files = {}

    def _file(self, name):
        if name not in self.files:
            path = os.path.join(self.dir, name)
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(n))
            header.pop("__metadata__", None)
            self.files[name] = (np.memmap(path, dtype=np.uint8, mode="r"), 8 + n, header)
        return self.files[name]

    def get(self, tensor):
        shard = self.where[tensor] if self.where is not None else "model.safetensors"
        raw, base, header = self._file(shard)
        if tensor not in header:
            sys.exit(f"peer: tensor {tensor} not in {shard}")
        meta = header[tensor]
        if meta["dtype"] not in DTYPES:
            sys.exit(f"peer: tensor {tensor} has dtype {meta['dtype']}; this peer script runs bf16/f32 checkpoints")
        np_t, torch_t = DTYPES[meta["dtype"]]
        b, e = meta["data_offsets"]
        arr = raw[base + b:base + e].view(np_t).reshape(meta["shape"])
        if torch_t == torch.bfloat16:
            return torch.from_numpy(np.ascontiguousarray(arr).view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(arr))

    def has(self, tensor):
        if self.where is not None:
            return tensor in self.where
        return tensor in self._file("model.safetensors")[2]


class Mlp:
    def __init__(self, ck, prefix):
        self.gate = ck.get(prefix + ".gate_proj.weight")
        self.up = ck.get(prefix + ".up_proj.weight")
        self.down = ck.get(prefix + ".down_proj.weight")

    def __call__(self, x):
        return F.linear(F.silu(F.linear(x, self.gate)) * F.linear(x, self.up), self.down)


class MoeBlock:
    """transformers' eager MoE block for the families of moe-spec.md."""

    def __init__(self, ck, cfg, layer, num_local_experts):
        p = f"model.layers.{layer}.mlp"
        self.cfg = cfg
        self.type = cfg["model_type"]
        self.qwen = self.type.startswith("qwen")
        self.num_experts = cfg.get("num_experts", cfg.get("n_routed_experts"))
        self.top_k = cfg["num_experts_per_tok"]
        self.norm = cfg.get("norm_topk_prob", not self.type == "qwen2_moe" and self.type != "deepseek_v2")
        self.gate = ck.get(p + ".gate.weight")
        self.bias = ck.get(p + ".gate.e_score_correction_bias").float() if ck.has(p + ".gate.e_score_correction_bias") else None
        n_local = num_local_experts or self.num_experts
        self.experts = [Mlp(ck, f"{p}.experts.{e}") for e in range(n_local)]
        shared = p + (".shared_expert" if self.qwen else ".shared_experts")
        self.shared = Mlp(ck, shared) if ck.has(shared + ".gate_proj.weight") else None
        self.shared_gate = ck.get(p + ".shared_expert_gate.weight") if ck.has(p + ".shared_expert_gate.weight") else None

    def tensors(self):
        mlps = self.experts + ([self.shared] if self.shared is not None else [])
        out = [self.gate] + [w for m in mlps for w in (m.gate, m.up, m.down)]
        return out + ([self.shared_gate] if self.shared_gate is not None else [])

    def upcast(self):
        self.gate = self.gate.float()
        for m in self.experts + ([self.shared] if self.shared is not None else []):
            m.gate, m.up, m.down = m.gate.float(), m.up.float(), m.down.float()
        if self.shared_gate is not None:
            self.shared_gate = self.shared_gate.float()

    def route(self, x):
        logits = F.linear(x.float(), self.gate.float()) if not self.qwen else F.linear(x, self.gate)
        if self.qwen or self.type == "deepseek_v2":
            probs = F.softmax(logits, dim=1, dtype=torch.float)
            w, idx = torch.topk(probs, self.top_k, dim=-1)
            if self.qwen and self.norm:
                w = w / w.sum(dim=-1, keepdim=True)
            if self.type == "deepseek_v2":
                w = w * self.cfg.get("routed_scaling_factor", 1.0)
            return w.to(x.dtype), idx
        scores = logits.sigmoid()  # DeepseekV3TopkRouter / MoEGate, noaux_tc
        choice = scores + self.bias
        ng, tg = self.cfg.get("n_group", 1), self.cfg.get("topk_group", 1)
        group_scores = choice.view(-1, ng, self.num_experts // ng).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=tg, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        mask = mask.unsqueeze(-1).expand(-1, ng, self.num_experts // ng).reshape(-1, self.num_experts)
        idx = torch.topk(choice.masked_fill(~mask.bool(), float("-inf")), k=self.top_k, dim=-1, sorted=False)[1]
        w = scores.gather(1, idx)
        if self.norm:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return (w * self.cfg.get("routed_scaling_factor", 1.0)).to(x.dtype), idx

    def __call__(self, x):
        w, idx = self.route(x)
        out = torch.zeros_like(x)
        mask = F.one_hot(idx, num_classes=self.num_experts).permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            e = int(e)
            if e >= len(self.experts):
                continue  # another expert-parallel rank's expert
            slot, tok = torch.where(mask[e])
            y = self.experts[e](x[tok]) * w[tok, slot, None]
            out.index_add_(0, tok, y.to(x.dtype))
        if self.shared is not None:
            s = self.shared(x)
            if self.shared_gate is not None:
                s = torch.sigmoid(F.linear(x, self.shared_gate)) * s
            out = out + s
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    ap.add_argument("--layer", type=int, default=-1, help="layer index (default: the first MoE layer written)")
    ap.add_argument("--experts", type=int, default=0, help="local experts present in the checkpoint (0: all)")
    ap.add_argument("--tokens", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--input", help=".npy [tokens, hidden] float32: run once on it and write --output")
    ap.add_argument("--output")
    ap.add_argument("--json", help="write the timings here")
    ap.add_argument("--compute-dtype", choices=["checkpoint", "float32"], default="checkpoint",
                    help="checkpoint: run in the weights' dtype, as transformers does with torch_dtype=auto; "
                         "float32: upcast the weights (the fp32 reference semantics moe-overlap computes)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    ck = Checkpoint(a.model)
    layer = a.layer
    if layer < 0:
        names = ck.where.keys() if ck.where is not None else ck._file("model.safetensors")[2].keys()
        layer = min(int(n.split(".")[2]) for n in names if n.endswith("mlp.gate.weight"))
    block = MoeBlock(ck, cfg, layer, a.experts)
    if a.compute_dtype == "float32":
        block.upcast()
    dtype = block.gate.dtype
    hidden = cfg["hidden_size"]
    if a.input:
        x = torch.from_numpy(np.load(a.input)).to(dtype)
        with torch.inference_mode():
            y = block(x).float().numpy()
        if a.output:
            np.save(a.output, y)
        return
    # Map every page of the checkpoint once before timing, as moe-overlap bench does: a serving process pays
    # the page faults once, not on every call.
    for t in block.tensors():
        float(t.reshape(-1)[::2048].float().sum())
    results = []
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for t in [int(v) for v in a.tokens.split(",")]:
            times = []
            for r in range(a.warmup + a.repeats):
                x = torch.randn(t, hidden, generator=gen).to(dtype)
                t0 = time.perf_counter()
                block(x)
                dt = (time.perf_counter() - t0) * 1e6
                if r >= a.warmup:
                    times.append(dt)
            q = statistics.quantiles(times, n=10)
            results.append({"tokens": t, "median_us": statistics.median(times), "p10_us": q[0], "p90_us": q[-1]})
            print(f"transformers-eager {cfg['model_type']} layer {layer} tokens {t:5d}: median {statistics.median(times):10.1f} us"
                  f"  (p10 {q[0]:.1f}, p90 {q[-1]:.1f}, dtype {str(dtype).replace('torch.', '')}, threads {a.threads})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"peer": "transformers-eager (PyTorch " + torch.__version__ + ")", "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
