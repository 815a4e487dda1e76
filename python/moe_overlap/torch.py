"""moe_overlap.torch.MoeBlock: the layer as a torch.nn.Module with the forward of Hugging Face's sparse MoE
blocks (Qwen2MoeSparseMoeBlock and relatives), to put in a model's `mlp`:

    block = MoeBlock.from_pretrained("/models/Qwen3-Next-80B-A3B-Instruct", layer=3, device=moe_overlap.Device(2))
    model.model.layers[3].mlp = block
    out, router_logits = block(hidden_states)    # [batch, seq, hidden] -> same shape and dtype, [batch*seq, E]

Inference only: the weights live in the C++ layer (memory-mapped, not parameters of the module) and the
output does not track gradients. A float32 input is read in place; a bfloat16 one costs one conversion to
float32 on the way in and one back on the way out (the layer computes in float32).
"""
import torch
import torch.nn.functional as F

from . import Layer


class MoeBlock(torch.nn.Module):
    """`forward(hidden_states [batch, seq, hidden]) -> (output, router_logits [batch*seq, E])`.

    router_logits are x @ W_router^T computed here in float32 from the layer's router weights (the C++ layer
    computes the same logits for its routing but does not return them); output_router_logits=False skips them
    and returns None in their place. Calls of more than the layer's max_tokens rows run in chunks of max_tokens.
    """

    def __init__(self, layer, schedule="dual", output_router_logits=True, prefill_from=None):
        super().__init__()
        if not isinstance(layer, Layer):
            raise TypeError(f"layer: expected a moe_overlap.Layer, got {type(layer).__name__}")
        self.layer = layer
        self.schedule = schedule
        self.output_router_logits = output_router_logits
        # Calls of at least this many rows are marked prefill (the decode-only policy then keeps them serial).
        self.prefill_from = prefill_from
        self.register_buffer("router_weight", torch.from_numpy(layer.router_weight), persistent=False)

    @classmethod
    def from_pretrained(cls, model, layer=-1, device=None, max_tokens=512, schedule="dual", output_router_logits=True,
                        **layer_options):
        """A checkpoint directory's layer (or a preset's); layer_options go to moe_overlap.Layer.from_pretrained."""
        return cls(Layer.from_pretrained(model, layer=layer, device=device, max_tokens=max_tokens, **layer_options),
                   schedule=schedule, output_router_logits=output_router_logits)

    def forward(self, hidden_states):
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.layer.hidden:
            raise ValueError(f"hidden_states: expected [batch, seq, {self.layer.hidden}], got "
                             f"{str(hidden_states.dtype).replace('torch.', '')} {list(hidden_states.shape)}")
        batch, seq, hidden = hidden_states.shape
        x = hidden_states.detach().reshape(batch * seq, hidden)
        if not x.is_contiguous():
            x = x.contiguous()
        if x.dtype not in (torch.float32, torch.bfloat16):
            x = x.float()
        rows = x.shape[0]
        out = torch.empty(rows, hidden, dtype=torch.float32)
        step = self.layer.max_tokens
        prefill = self.prefill_from is not None and rows >= self.prefill_from
        for r0 in range(0, rows, step):
            self.layer(x[r0:r0 + step], out=out[r0:r0 + step], schedule=self.schedule, prefill=prefill)
        logits = F.linear(x.float(), self.router_weight) if self.output_router_logits else None
        return out.to(hidden_states.dtype).view(batch, seq, hidden), logits

    def extra_repr(self):
        return f"{self.layer!r}, schedule={self.schedule!r}"
