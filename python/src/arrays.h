// The activations a call takes and returns: a NumPy float32 array or a CPU torch.Tensor, [tokens, hidden],
// C-contiguous. float32 is read in place (no copy); a bfloat16 tensor is converted to float32 into a buffer
// the call owns (one pass over x). Every check names the argument and what was expected, e.g.
//   x: expected float32 [tokens, 2048], got float64 [3, 2048]
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>

namespace moe::py_api {

namespace py = pybind11;

// An input as the layer reads it. `data` is the caller's memory, or `buffer`'s after convert().
struct Input {
  py::object owner;        // the caller's array or tensor (kept alive while the device reads it)
  py::object buffer;       // float32 buffer for a bfloat16 tensor; none otherwise
  const float* data = nullptr;
  const uint16_t* bf16 = nullptr;  // the bfloat16 source of `buffer`
  int64_t tokens = 0;
  int64_t hidden = 0;
  bool torch = false;      // a torch.Tensor (the output of a call is one too)
  // bfloat16 -> float32 into `buffer` (nothing for float32). Touches no Python object: callable without the GIL.
  void convert() const;
};

struct Output {
  py::object owner;  // what the call returns
  float* data = nullptr;
};

// Checks `x` (named `arg` in messages): std::invalid_argument on a wrong type, dtype, shape, layout or device.
Input resolve_input(py::handle x, int64_t hidden, const char* arg);
// `out` given: checked against [tokens, hidden] float32 and writeable; None: a new array, or a new tensor when
// the input was a tensor.
Output resolve_output(py::handle out, const Input& in, int64_t hidden, const char* arg);
// A new float32 array [rows, cols] (the router weights, the bf16 conversion buffers).
py::array_t<float> new_float_array(int64_t rows, int64_t cols);

// What the binding knows about torch, looked up once torch is imported (it is, if a tensor was passed).
struct TorchTypes {
  py::object tensor, float32, bfloat16, uint8, empty;
};
// Null when torch is not importable.
const TorchTypes* torch_types();
bool is_tensor(py::handle obj);

}  // namespace moe::py_api
