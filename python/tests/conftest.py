"""Shared fixtures: the moe-overlap command (MOE_OVERLAP_BIN, set by ctest), small checkpoints it writes, a
device, and a reader of safetensors files into NumPy arrays (for Layer(config, weights))."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import moe_overlap as mo

SOURCE_DIR = os.environ.get("MOE_OVERLAP_SOURCE_DIR",
                            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# One preset per family (docs/model-families.md); deepseek_v32 is deepseek-v3's checkpoint renamed.
FAMILIES = {
    "qwen3_next": "qwen3-next-80b-a3b",
    "qwen2_moe": "qwen1.5-moe-a2.7b",
    "qwen3_moe": "qwen3-30b-a3b",
    "deepseek_v2": "deepseek-v2-lite",
    "deepseek_v3": "deepseek-v3",
    "deepseek_v32": "deepseek-v3",
    "kimi_k2": "kimi-k2",
    "glm4_moe": "glm-4.5-air",
    "glm_moe_dsa": "glm-5",
}
DTYPES = ("f32", "bf16", "fp8")
HIDDEN = 64
SMALL = ["--hidden", str(HIDDEN), "--intermediate", "32", "--num-experts", "16"]


def moe_bin():
    path = os.environ.get("MOE_OVERLAP_BIN")
    if not path or not os.path.exists(path):
        pytest.fail("MOE_OVERLAP_BIN must name the moe-overlap binary (ctest sets it), got " + repr(path))
    return path


def run_cli(*args):
    r = subprocess.run([moe_bin(), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"moe-overlap {' '.join(args)} failed: {r.stdout}{r.stderr}")
    return r.stdout


class Checkpoints:
    """Small checkpoints written once per session by `moe-overlap make-checkpoint`."""

    def __init__(self, root):
        self.root = root
        self.made = {}

    def get(self, family, dtype="bf16", fused=False):
        key = (family, dtype, fused)
        if key not in self.made:
            out = str(self.root / f"{family}-{dtype}{'-fused' if fused else ''}")
            run_cli("make-checkpoint", "--preset", FAMILIES[family], "--dtype", dtype, "--out", out, "--seed", "3",
                    *SMALL, *(["--fused"] if fused else []))
            if family == "deepseek_v32":
                path = os.path.join(out, "config.json")
                with open(path) as f:
                    cfg = json.load(f)
                cfg["model_type"] = "deepseek_v32"
                with open(path, "w") as f:
                    json.dump(cfg, f)
            self.made[key] = out
        return self.made[key]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    return Checkpoints(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="session")
def device():
    return mo.Device(workers=2)


def random_x(tokens, hidden=HIDDEN, seed=0):
    return np.random.default_rng(seed).standard_normal((tokens, hidden)).astype(np.float32)


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_bitwise(a, b, what=""):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, what
    diff = np.flatnonzero(bits(a) != bits(b))
    assert diff.size == 0, f"{what}: {diff.size} values differ, first at {diff[0]}: {a.flat[diff[0]]} vs {b.flat[diff[0]]}"


SAFETENSORS_DTYPES = {"F32": np.float32, "BF16": np.uint16, "F8_E4M3": np.uint8, "I32": np.int32, "I64": np.int64}


def read_safetensors_dir(model_dir):
    """Every tensor of a model directory as a NumPy array (bf16 as uint16 bit patterns, fp8 as uint8 codes)."""
    out = {}
    for name in sorted(os.listdir(model_dir)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(model_dir, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        header.pop("__metadata__", None)
        for tensor, meta in header.items():
            b, e = meta["data_offsets"]
            out[tensor] = np.frombuffer(data[b:e], dtype=SAFETENSORS_DTYPES[meta["dtype"]]).reshape(meta["shape"]).copy()
    return out


def peer_module():
    """scripts/peer_transformers.py: transformers' eager MoE block in PyTorch."""
    scripts = os.path.join(SOURCE_DIR, "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import peer_transformers
    return peer_transformers
