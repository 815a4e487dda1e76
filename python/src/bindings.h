// The pieces of the `moe_overlap._core` extension (docs/python.md), one function per concern.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "runtime/runtime.h"

namespace moe::py_api {

namespace py = pybind11;

// moe_overlap.Device: one CPU device (a pool of worker threads with streams). Layers keep their device alive.
struct PyDevice {
  std::unique_ptr<rt::Device> device;
  rt::Device& get() const { return *device; }
};

void bind_runtime(py::module_& m);  // Device, Stream, trace, sanitizer (runtime_py.cpp)
void bind_layer(py::module_& m);    // Layer, Graph, Pending, OverlapPolicy (layer_py.cpp)

}  // namespace moe::py_api
