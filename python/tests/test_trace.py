"""trace(): a Perfetto (Chrome trace JSON) file of the calls inside it."""
import json

import numpy as np
import pytest

import moe_overlap as mo
from conftest import random_x


def test_trace_writes_the_calls(checkpoints, tmp_path):
    dev = mo.Device(workers=2)
    layer = mo.Layer.from_pretrained(checkpoints.get("qwen3_next", "bf16"), device=dev, max_tokens=4)
    x = random_x(4)
    layer(x)  # outside: not traced
    path, svg = tmp_path / "trace.json", tmp_path / "timeline.svg"
    with mo.trace(str(path), dev, svg=str(svg)) as t:
        layer(x, schedule="dual")
    events = json.loads(path.read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "op"]
    assert len(ops) == t.num_ops > 0
    assert len({e["tid"] for e in ops}) == 2  # dual: the main and the side stream
    assert any(e.get("cat") == "event" for e in events)  # the fork and join
    assert svg.read_text().startswith("<svg") or "<svg" in svg.read_text()[:200]
    # A failing block writes no file.
    bad = tmp_path / "bad.json"
    with pytest.raises(ValueError):
        with dev.trace(str(bad)):
            layer(np.zeros((2, 3), np.float32))
    assert not bad.exists()
    with pytest.raises(RuntimeError, match=str(tmp_path / "no-dir")):
        with dev.trace(str(tmp_path / "no-dir" / "t.json")):
            layer(x)
