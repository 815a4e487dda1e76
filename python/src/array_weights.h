// One MoE layer's weights from Python arrays (NumPy or CPU torch tensors) keyed by their Hugging Face names,
// as in a checkpoint (src/io/checkpoint.h, docs/model-families.md): "model.layers.{layer}.mlp.gate.weight",
// or relative to the layer's MLP ("gate.weight"). The arrays are used in place (no copy) and must stay alive
// as long as the weights: `keep` receives them.
//   float32 -> F32; bfloat16 (torch) or uint16/int16 bit patterns (NumPy) -> BF16; uint8 e4m3 codes (or
//   torch.float8_e4m3fn) -> F8_E4M3 with their float32 "*_scale_inv" blocks.
// Throws ConfigError naming the tensor and what was expected.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace moe::py_api {

namespace py = pybind11;

LayerWeights weights_from_arrays(const MoeConfig& config, const py::dict& tensors, int64_t layer,
                                 std::vector<py::object>& keep);

}  // namespace moe::py_api
