"""moe_overlap.torch.MoeBlock against transformers' eager MoE block (scripts/peer_transformers.py)."""
import numpy as np
import pytest

from conftest import FAMILIES, assert_bitwise, peer_module

torch = pytest.importorskip("torch")
import moe_overlap as mo  # noqa: E402
from moe_overlap.torch import MoeBlock  # noqa: E402

# The peer's tolerance (docs/benchmarking.md): with float32 compute it agrees to about 2e-6 of max|y|.
REL_TOL = 2e-5


def peer_block(model_dir):
    import json
    import os
    peer = peer_module()
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    ck = peer.Checkpoint(model_dir)
    block = peer.MoeBlock(ck, cfg, cfg.get("first_k_dense_replace", 0), 0)
    block.upcast()  # float32 compute: the semantics moe-overlap computes
    return block


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_block_matches_transformers_eager(family, dtype, checkpoints, device):
    model = checkpoints.get(family, dtype)
    block = MoeBlock.from_pretrained(model, device=device, max_tokens=16)
    peer = peer_block(model)
    h = torch.from_numpy(np.random.default_rng(1).standard_normal((2, 7, 64)).astype(np.float32))
    with torch.inference_mode():
        out, logits = block(h)
        want = peer(h.reshape(-1, 64))
        want_logits = torch.nn.functional.linear(h.reshape(-1, 64), peer.gate.float())
    assert out.shape == h.shape and out.dtype == torch.float32
    assert logits.shape == (14, block.layer.num_experts) and logits.dtype == torch.float32
    err = (out.reshape(-1, 64) - want).abs().max().item()
    assert err <= REL_TOL * want.abs().max().item(), f"{family} {dtype}: max error {err}"
    assert torch.allclose(logits, want_logits, rtol=1e-5, atol=1e-6)
    # The block's output is the layer's.
    assert_bitwise(out.reshape(-1, 64).numpy(), block.layer(h.reshape(-1, 64).numpy()), "block vs layer")


def test_block_bf16_chunks_and_swap(checkpoints, device):
    model = checkpoints.get("qwen3_next", "bf16")
    block = MoeBlock.from_pretrained(model, device=device, max_tokens=4, schedule="fused")
    h = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0))
    out, logits = block(h)  # 15 rows in chunks of 4
    assert_bitwise(out.reshape(-1, 64).numpy(), mo.Layer.from_pretrained(model, device=device, max_tokens=15)(
        h.reshape(-1, 64).numpy()), "chunked")
    hb = h.to(torch.bfloat16)
    out_b, logits_b = block(hb)
    assert out_b.dtype == torch.bfloat16 and out_b.shape == hb.shape
    # bf16 in: one conversion to float32 (exact), float32 compute, one rounding back.
    ref, _ = block(hb.float())
    assert torch.equal(out_b, ref.to(torch.bfloat16))
    # Non-contiguous hidden states (a transposed view) are copied once.
    ht = h.transpose(0, 1).contiguous().transpose(0, 1)
    assert not ht.is_contiguous()
    assert torch.equal(block(ht)[0], out)
    # A drop-in replacement for a model's mlp.
    model_like = torch.nn.Module()
    model_like.mlp = block
    assert "MoeBlock" in repr(model_like)
    no_logits = MoeBlock(block.layer, output_router_logits=False)
    assert no_logits(h)[1] is None
    with pytest.raises(ValueError, match=r"hidden_states: expected \[batch, seq, 64\], got float32 \[15, 64\]"):
        block(h.reshape(15, 64))
