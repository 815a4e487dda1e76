"""Every schedule gives bitwise the output of serial, eagerly and as a replayed graph, for every family."""
import numpy as np
import pytest

import moe_overlap as mo
from conftest import FAMILIES, assert_bitwise, random_x

SCHEDULES = ("serial", "dual", "phased", "fused", "auto")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_schedule_equals_serial(family, checkpoints, device):
    tuning = {1: "dual", 4: "phased", 16: "fused"}
    layer = mo.Layer.from_pretrained(checkpoints.get(family, "bf16"), device=device, max_tokens=17, policy="always",
                                     tuning=tuning)
    for tokens in (1, 4, 17):
        x = random_x(tokens, seed=tokens)
        serial = layer(x, schedule="serial")
        for s in SCHEDULES:
            ran, reason = layer.effective_schedule(tokens, s)
            if layer.has_shared_expert:
                assert ran == (tuning[max(t for t in tuning if t <= tokens)] if s == "auto" else s), reason
            else:
                assert ran == "serial" and (s == "serial" or "shared expert" in reason), reason
            assert_bitwise(layer(x, schedule=s), serial, f"{family} {tokens} tokens {s} eager")
            out = np.full_like(x, np.nan)
            g = layer.capture(x, out, schedule=s)
            assert g.schedule == ran and g.tokens == tokens
            assert np.isnan(out).all()  # capture runs nothing
            assert_bitwise(g.replay(), serial, f"{family} {tokens} tokens {s} graph")


def test_graph_replays_new_input_in_place(checkpoints, device):
    layer = mo.Layer.from_pretrained(checkpoints.get("qwen3_next", "bf16"), device=device, max_tokens=4)
    x, out = random_x(4, seed=1), np.empty((4, layer.hidden), np.float32)
    g = layer.capture(x, out, schedule="dual")
    for seed in (2, 3):
        x[...] = random_x(4, seed=seed)  # new data into the captured buffer
        assert g.replay() is out
        assert_bitwise(out, layer(x.copy(), schedule="serial"), f"replay {seed}")
    assert layer.replay(g, x, out) is out


def test_policy_sends_dual_back_to_serial(checkpoints, device):
    model = checkpoints.get("qwen3_next", "bf16")
    layer = mo.Layer.from_pretrained(model, device=device, max_tokens=8,
                                     policy=mo.OverlapPolicy(token_threshold=4))
    assert layer.effective_schedule(4, "dual")[0] == "dual"
    ran, reason = layer.effective_schedule(5, "dual")
    assert ran == "serial" and "4" in reason
    ran, reason = layer.effective_schedule(2, "phased", prefill=True)
    assert ran == "serial" and "prefill" in reason
    off = mo.Layer.from_pretrained(model, device=device, policy=mo.OverlapPolicy(multi_stream=False))
    assert off.effective_schedule(1, "dual")[0] == "serial"
    assert mo.Layer.from_pretrained(model, device=device).effective_schedule(300, "dual")[0] == "serial"  # 256
    assert mo.Layer.from_pretrained(model, device=device, policy="always").effective_schedule(300, "dual")[0] == "dual"
    assert set(mo.SCHEDULES) == set(SCHEDULES)


def test_async_calls_and_synchronize(checkpoints, device):
    layer = mo.Layer.from_pretrained(checkpoints.get("glm4_moe", "bf16"), device=device, max_tokens=8)
    xs = [random_x(8, seed=s) for s in range(4)]
    want = [layer(x, schedule="serial") for x in xs]
    outs = [np.empty_like(x) for x in xs]
    pending = [layer.forward_async(x, out=o, schedule="phased") for x, o in zip(xs, outs)]
    assert pending[-1].wait() is outs[-1]
    assert all(p.done() for p in pending)
    for o, w in zip(outs, want):
        assert_bitwise(o, w, "async")
    # Inputs dropped by the caller stay alive until the device is done with them.
    outs = [layer.forward_async(random_x(8, seed=s)).out for s in range(4)]
    layer.synchronize()
    for o, w in zip(outs, want):
        assert_bitwise(o, w, "async, input dropped")
    x, out = random_x(8, seed=0), np.empty((8, layer.hidden), np.float32)
    g = layer.capture(x, out)
    p = g.replay_async()
    assert p.wait() is out
    assert_bitwise(out, want[0], "graph replay_async")
