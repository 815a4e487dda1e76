"""The module's output equals the moe-overlap command's bit for bit: every family, every weight type, the
per-expert and the fused expert layout, eager and graph, from a directory, from arrays and from a preset."""
import os

import numpy as np
import pytest

import moe_overlap as mo
from conftest import DTYPES, FAMILIES, HIDDEN, assert_bitwise, random_x, read_safetensors_dir, run_cli


def cli_output(tmp_path, model, x, *extra):
    xin, yout = str(tmp_path / "x.npy"), str(tmp_path / "y.npy")
    np.save(xin, x)
    run_cli("run", "--model", model, "--input", xin, "--output", yout, "--threads", "2", *extra)
    return np.load(yout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_checkpoint_matches_cli(family, dtype, checkpoints, device, tmp_path):
    model = checkpoints.get(family, dtype)
    x = random_x(5, seed=sorted(FAMILIES).index(family) * 3 + DTYPES.index(dtype))
    want = cli_output(tmp_path, model, x, "--schedule", "dual")
    layer = mo.Layer.from_pretrained(model, device=device, max_tokens=8)
    assert layer.dtype == dtype and layer.config["model_type"] == family
    assert_bitwise(layer(x, schedule="dual"), want, f"{family} {dtype} eager")
    out = np.empty_like(x)
    g = layer.capture(x, out, schedule="dual")
    assert_bitwise(g.replay(), want, f"{family} {dtype} graph")
    # From the same tensors held in NumPy arrays (bf16 as uint16, fp8 as uint8 codes).
    with open(os.path.join(model, "config.json")) as f:
        config = f.read()
    from_arrays = mo.Layer(config, read_safetensors_dir(model), device=device, max_tokens=8)
    assert_bitwise(from_arrays(x), want, f"{family} {dtype} from arrays")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_fused_layout_matches_cli(dtype, checkpoints, device, tmp_path):
    model = checkpoints.get("qwen3_next", dtype, fused=True)
    x = random_x(3, seed=5)
    want = cli_output(tmp_path, model, x, "--schedule", "phased")
    layer = mo.Layer.from_pretrained(model, device=device, max_tokens=4)
    assert_bitwise(layer(x, schedule="phased"), want, "fused layout")
    with open(os.path.join(model, "config.json")) as f:
        config = f.read()
    assert_bitwise(mo.Layer(config, read_safetensors_dir(model), device=device, max_tokens=4)(x), want, "arrays")


def test_preset_matches_cli(device, tmp_path):
    # A preset at its real width, two experts kept (routing still over all 60).
    x = random_x(2, hidden=2048, seed=9)
    want = cli_output(tmp_path, "qwen1.5-moe-a2.7b", x, "--experts", "2", "--dtype", "bf16", "--seed", "4")
    layer = mo.Layer.from_pretrained("qwen1.5-moe-a2.7b", experts=2, dtype="bf16", seed=4, device=device, max_tokens=2)
    assert layer.hidden == 2048 and layer.num_experts == 60
    assert_bitwise(layer(x), want, "preset")


def test_torch_input_matches_numpy(checkpoints, device):
    torch = pytest.importorskip("torch")
    layer = mo.Layer.from_pretrained(checkpoints.get("deepseek_v3", "fp8"), device=device, max_tokens=8)
    x = random_x(6, seed=2)
    want = layer(x)
    y = layer(torch.from_numpy(x))
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    assert_bitwise(y.numpy(), want, "torch float32")
    # bfloat16 input: converted once to float32, so it equals the call on the rounded values.
    xb = torch.from_numpy(x).to(torch.bfloat16)
    assert_bitwise(layer(xb).numpy(), layer(xb.float().numpy()), "torch bfloat16")


@pytest.mark.parametrize("family", ["kimi_k2", "qwen3_next"])
def test_int4_checkpoint_matches_cli(family, checkpoints, device, tmp_path):
    # compressed-tensors int4 experts: loaded from a directory (the arrays constructor takes f32/bf16/fp8).
    model = checkpoints.get(family, "int4")
    x = random_x(4, seed=11)
    want = cli_output(tmp_path, model, x, "--schedule", "fused")
    layer = mo.Layer.from_pretrained(model, device=device, max_tokens=4)
    assert layer.dtype == "int4"
    assert_bitwise(layer(x, schedule="fused"), want, f"{family} int4")
    assert_bitwise(layer(x, schedule="serial"), want, f"{family} int4 serial")
    with open(os.path.join(model, "config.json")) as f:
        config = f.read()
    with pytest.raises(mo.ConfigError, match=r"weight_packed' is int4 \(compressed-tensors\).*Layer.from_pretrained"):
        mo.Layer(config, read_safetensors_dir(model), device=device)
