// The `moe_overlap._core` extension: the MoE layer of moe-overlap from Python (docs/python.md). The errors
// of the C++ API arrive as Python exceptions with the same one-line messages:
//   moe::ConfigError   -> moe_overlap.ConfigError (ValueError)   a bad config field or tensor
//   moe::IoError       -> moe_overlap.IoError (RuntimeError)     a file that cannot be read or is malformed
//   rt::StreamError    -> moe_overlap.StreamError (RuntimeError) an operation failed on the device
//   rt::RaceError      -> moe_overlap.RaceError (RuntimeError)   the stream sanitizer found a hazard
//   std::invalid_argument -> ValueError                          a wrong argument, named in the message
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "io/io_error.h"
#include "model/config.h"
#include "runtime/sanitizer.h"

PYBIND11_MODULE(_core, m) {
  namespace py = pybind11;
  m.doc() = "moe-overlap's MoE layer on its CPU stream runtime (docs/python.md)";
  py::register_exception<moe::ConfigError>(m, "ConfigError", PyExc_ValueError);
  py::register_exception<moe::IoError>(m, "IoError", PyExc_RuntimeError);
  py::register_exception<moe::rt::StreamError>(m, "StreamError", PyExc_RuntimeError);
  py::register_exception<moe::rt::RaceError>(m, "RaceError", PyExc_RuntimeError);
  moe::py_api::bind_runtime(m);
  moe::py_api::bind_layer(m);
}
