"""moe-overlap's MoE layer from NumPy and PyTorch (docs/python.md).

    import numpy as np, moe_overlap as mo
    dev = mo.Device(workers=2)
    layer = mo.Layer.from_pretrained("/tmp/qwen-next", device=dev, max_tokens=64)
    x = np.random.randn(4, layer.hidden).astype(np.float32)
    y = layer(x, schedule="dual")                  # float32 [4, hidden]; x is read in place
    layer(x, out=y)                                # into the caller's buffer
    g = layer.capture(x, y)                        # graph of this token count: write into x, then
    g.replay()
    with mo.trace("trace.json", dev):              # Perfetto / chrome://tracing
        layer(x, out=y)
    with mo.sanitizer(dev) as s:                   # RaceError on a cross-stream hazard
        layer(x, out=y)
"""
from ._core import (  # noqa: F401
    SCHEDULES,
    ConfigError,
    Device,
    Graph,
    Hazard,
    IoError,
    Layer,
    OverlapPolicy,
    Pending,
    RaceError,
    Stream,
    StreamError,
    sanitizer,
)

__all__ = ["SCHEDULES", "ConfigError", "Device", "Graph", "Hazard", "IoError", "Layer", "OverlapPolicy", "Pending",
           "RaceError", "Stream", "StreamError", "default_device", "sanitizer", "trace"]

_default_device = None


def default_device():
    """The device layers use when none is given: created on first use, Device(workers=0) (one per core)."""
    global _default_device
    if _default_device is None:
        _default_device = Device(workers=0)
    return _default_device


def trace(path, device=None, svg="", title="moe_overlap trace"):
    """Context manager: the operations of `device` (default_device() if None) inside it, written as Chrome trace
    JSON to `path` (opens in Perfetto) at exit, and as an SVG timeline to `svg` if given."""
    return (device if device is not None else default_device()).trace(path, svg=svg, title=title)
