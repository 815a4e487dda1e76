"""No copy of the input or the output (by address), and layers called from several Python threads."""
import threading

import numpy as np
import pytest

import moe_overlap as mo
from conftest import assert_bitwise, random_x


def test_numpy_buffers_are_used_in_place(checkpoints, device):
    layer = mo.Layer.from_pretrained(checkpoints.get("kimi_k2", "fp8"), device=device, max_tokens=8)
    x, out = random_x(8), np.empty((8, 64), np.float32)
    assert layer(x, out=out) is out
    g = layer.capture(x, out)
    assert g.input_address == x.ctypes.data and g.output_address == out.ctypes.data
    # A row slice of a bigger array is contiguous: read and written where it lies.
    big_x, big_out = random_x(16), np.zeros((16, 64), np.float32)
    g = layer.capture(big_x[8:], big_out[8:])
    assert g.input_address == big_x[8:].ctypes.data and g.output_address == big_out[8:].ctypes.data
    g.replay()
    assert not big_out[:8].any()
    assert_bitwise(big_out[8:], layer(big_x[8:].copy()), "slice")


def test_torch_buffers_are_used_in_place(checkpoints, device):
    torch = pytest.importorskip("torch")
    layer = mo.Layer.from_pretrained(checkpoints.get("qwen2_moe", "bf16"), device=device, max_tokens=8)
    x, out = torch.randn(5, 64), torch.empty(5, 64)
    ptr = out.data_ptr()
    assert layer(x, out=out) is out and out.data_ptr() == ptr
    g = layer.capture(x, out)
    assert g.input_address == x.data_ptr() and g.output_address == out.data_ptr()
    # bfloat16: read through one float32 buffer (the only copy), converted again at each replay.
    xb = x.to(torch.bfloat16)
    g = layer.capture(xb, out)
    assert g.input_address != xb.data_ptr() and g.output_address == out.data_ptr()
    xb.copy_(torch.randn(5, 64).to(torch.bfloat16))
    g.replay()
    assert_bitwise(out.numpy(), layer(xb.float().numpy()), "bf16 replay converts the new input")
    assert layer.replay(g, xb, out) is out


def test_sanitizer_sees_the_callers_buffers(checkpoints, device):
    # Layer b reads layer a's output on another stream without waiting: the race is on the caller's bytes,
    # so neither a's output nor b's input was copied.
    a = mo.Layer.from_pretrained(checkpoints.get("qwen3_next", "bf16"), device=device, max_tokens=4)
    b = mo.Layer.from_pretrained(checkpoints.get("glm4_moe", "bf16"), device=device, max_tokens=4)
    x, mid, out = random_x(4), np.empty((4, 64), np.float32), np.empty((4, 64), np.float32)
    s1, s2 = device.create_stream(name="s1"), device.create_stream(name="s2")
    with mo.sanitizer(device, raise_on_hazard=False) as san:
        with s1:
            a.forward_async(x, out=mid)
        with s2:
            b.forward_async(mid, out=out)
        device.synchronize()
    hazards = san.hazards
    assert hazards, "the unordered read of mid must be reported"
    assert all(h.kind == "read-after-write" for h in hazards), hazards
    lo, hi = mid.ctypes.data, mid.ctypes.data + mid.nbytes
    assert all(lo <= h.ptr and h.ptr + h.bytes <= hi for h in hazards), hazards
    # b's routed path on s2 and its shared expert on the side stream "11" both read mid; a wrote it on s1.
    assert {h.stream for h in hazards} == {s2.name, "11"} and {h.previous_stream for h in hazards} == {s1.name}
    # Ordered by an event between the streams: no hazard, and raising mode stays quiet.
    with mo.sanitizer(device) as san:
        with s1:
            a.forward_async(x, out=mid)
        s2.wait_stream(s1)
        with s2:
            b.forward_async(mid, out=out).wait()
    assert san.hazards == []
    with pytest.raises(mo.RaceError, match="read-after-write"):
        with mo.sanitizer(device):
            with s1:
                a.forward_async(x, out=mid)
            with s2:
                b.forward_async(mid, out=out)
    device.synchronize()


def test_two_threads_two_layers(checkpoints, device):
    layers = [mo.Layer.from_pretrained(checkpoints.get(f, "bf16"), device=device, max_tokens=8)
              for f in ("qwen3_next", "deepseek_v3")]
    inputs = [[random_x(1 + (i % 8), seed=i) for i in range(30)] for _ in layers]
    want = [[layer(x, schedule="serial") for x in xs] for layer, xs in zip(layers, inputs)]
    got = [[None] * 30 for _ in layers]
    errors = []

    def work(k, stream):
        try:
            with stream if stream is not None else _null():
                for i, x in enumerate(inputs[k]):
                    got[k][i] = layers[k](x, schedule=("dual", "phased", "fused")[i % 3])
        except Exception as e:  # reported below
            errors.append(e)

    for streams in ([None, None], [device.create_stream(), device.create_stream()]):
        threads = [threading.Thread(target=work, args=(k, streams[k])) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for k in range(2):
            for i in range(30):
                assert_bitwise(got[k][i], want[k][i], f"thread {k} call {i}")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
