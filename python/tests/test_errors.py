"""Bad input raises a Python exception with one line naming the argument, file, tensor or field."""
import json
import os

import numpy as np
import pytest

import moe_overlap as mo
from conftest import random_x, read_safetensors_dir


@pytest.fixture(scope="module")
def layer(checkpoints, device):
    return mo.Layer.from_pretrained(checkpoints.get("qwen3_next", "bf16"), device=device, max_tokens=8)


def test_wrong_arrays(layer):
    x = random_x(3)
    with pytest.raises(ValueError, match=r"^x: expected float32 \[tokens, 64\], got float64 \[3, 64\]$"):
        layer(x.astype(np.float64))
    with pytest.raises(ValueError, match=r"^x: expected float32 \[tokens, 64\], got float32 \[3, 63\]$"):
        layer(np.zeros((3, 63), np.float32))
    with pytest.raises(ValueError, match=r"^x: expected float32 \[tokens, 64\], got float32 \[192\]$"):
        layer(x.reshape(-1))
    with pytest.raises(ValueError, match=r"^x: expected a C-contiguous float32 \[tokens, 64\] array, got a non-contiguous"):
        layer(np.zeros((3, 128), np.float32)[:, ::2])
    with pytest.raises(ValueError, match=r"^x: expected a NumPy array or a torch.Tensor.*got an object of type list"):
        layer([[0.0] * 64])
    with pytest.raises(ValueError, match=r"^out: expected float32 \[3, 64\], got float32 \[4, 64\]$"):
        layer(x, out=np.empty((4, 64), np.float32))
    ro = np.empty((3, 64), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out: expected a writeable float32 \[3, 64\] array, got a read-only one$"):
        layer(x, out=ro)
    with pytest.raises(ValueError, match=r"^out: overlaps x"):
        layer(x, out=x)
    with pytest.raises(ValueError, match=r"^x: 9 tokens, more than this layer's max_tokens=8"):
        layer(random_x(9))
    with pytest.raises(ValueError, match="serial, dual, phased, fused"):
        layer(x, schedule="sideways")
    assert layer(np.zeros((0, 64), np.float32)).shape == (0, 64)


def test_wrong_tensors(layer):
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"^x: expected float32 \(or bfloat16\) \[tokens, 64\], got float16 \[3, 64\]$"):
        layer(torch.zeros(3, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"^x: expected a contiguous float32 \[tokens, 64\] tensor, got a non-contiguous"):
        layer(torch.zeros(64, 3).t())
    with pytest.raises(ValueError, match=r"^x: expected a CPU tensor, got one on device meta$"):
        layer(torch.empty(3, 64, device="meta"))
    with pytest.raises(ValueError, match=r"^out: expected float32 \[3, 64\], got bfloat16 \[3, 64\]$"):
        layer(torch.zeros(3, 64), out=torch.zeros(3, 64, dtype=torch.bfloat16))


def test_failed_operation_raises_stream_error(layer):
    x = random_x(2)
    x[1, 5] = np.nan
    with pytest.raises(mo.StreamError, match="token 1.*column 5"):
        layer(x, check_input=True)
    assert np.isfinite(layer(random_x(2), check_input=True)).all()  # usable again


def test_graph_refuses_other_buffers(layer):
    x, out = random_x(4), np.empty((4, 64), np.float32)
    g = layer.capture(x, out)
    with pytest.raises(ValueError, match="input pointer x differs from the capture"):
        layer.replay(g, x.copy(), out)
    with pytest.raises(ValueError, match="output pointer y differs from the capture"):
        layer.replay(g, x, np.empty_like(out))
    with pytest.raises(ValueError, match="token count differs"):
        layer.replay(g, x[:2], out[:2])


def test_bad_models(tmp_path, device, checkpoints):
    with pytest.raises(ValueError, match="^model: 'no-such-model' is neither a directory nor a preset"):
        mo.Layer.from_pretrained("no-such-model", device=device)
    with pytest.raises(ValueError, match="^dtype applies to presets only"):
        mo.Layer.from_pretrained(checkpoints.get("glm4_moe", "bf16"), dtype="fp8", device=device)
    with pytest.raises(ValueError, match="^isa: expected auto, scalar, avx2, avx512, avx512bf16 or avx2int8, got 'sse9'"):
        mo.Layer.from_pretrained("qwen3-next-80b-a3b", isa="sse9", device=device)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "qwen3_next", "hidden_size": "wide"}')
    with pytest.raises(mo.ConfigError, match="hidden_size"):
        mo.Layer.from_pretrained(str(bad), device=device)
    (bad / "config.json").write_text(open(os.path.join(checkpoints.get("glm4_moe", "bf16"), "config.json")).read())
    with pytest.raises(mo.IoError, match="model.safetensors"):
        mo.Layer.from_pretrained(str(bad), device=device)
    assert issubclass(mo.ConfigError, ValueError) and issubclass(mo.IoError, RuntimeError)
    assert issubclass(mo.StreamError, RuntimeError) and issubclass(mo.RaceError, RuntimeError)


def test_bad_weight_arrays(checkpoints, device):
    model = checkpoints.get("deepseek_v3", "fp8")
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    layer_index = config["first_k_dense_replace"]
    p = f"model.layers.{layer_index}.mlp."
    w = read_safetensors_dir(model)
    missing = dict(w)
    del missing[p + "experts.3.up_proj.weight"]
    with pytest.raises(mo.ConfigError, match=rf"'{p}experts.3.up_proj.weight' \(expected shape \[32, 64\]\) is missing"):
        mo.Layer(config, missing, device=device)
    shaped = dict(w, **{p + "gate.weight": w[p + "gate.weight"][:, :32]})
    with pytest.raises(mo.ConfigError, match=r"gate.weight'\] is not C-contiguous"):
        mo.Layer(config, shaped, device=device)
    shaped[p + "gate.weight"] = np.ascontiguousarray(shaped[p + "gate.weight"])
    with pytest.raises(mo.ConfigError, match=r"gate.weight'\] has shape \[16, 32\], expected \[16, 64\]"):
        mo.Layer(config, shaped, device=device)
    typed = dict(w, **{p + "gate.weight": w[p + "gate.weight"].astype(np.float64)})
    with pytest.raises(mo.ConfigError, match=r"gate.weight'\] has dtype float64, expected float32, bfloat16$"):
        mo.Layer(config, typed, device=device)
    # Names relative to the layer's MLP are accepted too.
    relative = {k[len(p):]: v for k, v in w.items() if k.startswith(p)}
    x = random_x(2)
    assert np.array_equal(mo.Layer(config, relative, device=device)(x), mo.Layer(config, w, device=device)(x))
    with pytest.raises(mo.ConfigError, match="layer 0 is not an MoE layer"):
        mo.Layer(config, w, layer=0, device=device)
