// Device, Stream, the tracing scope (Perfetto JSON via tools/moe-overlap/trace_export.h) and the stream
// sanitizer scope (runtime/sanitizer.h).
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "runtime/sanitizer.h"
#include "trace_export.h"

namespace moe::py_api {

namespace {

// `with stream:` makes it the current stream of the calling thread (runtime.h's StreamGuard); nested scopes
// restore the previous one in order. Exit must happen on the thread that entered.
struct PyStream {
  rt::Stream stream;
  std::vector<std::shared_ptr<rt::StreamGuard>> guards;
};

// `with device.trace(path):` records every operation of the device inside it and writes Chrome trace JSON
// (Perfetto, chrome://tracing) at the end, after the device is idle; an optional SVG timeline too.
struct TraceScope {
  std::shared_ptr<PyDevice> dev;
  std::string path, svg, title;
  std::optional<rt::Trace> trace;
};

struct Hazard {
  std::string kind, message, op, stream, previous_op, previous_stream;
  uintptr_t ptr = 0;
  size_t bytes = 0;
};

// `with moe_overlap.sanitizer(device) as s:` checks every stream operation of the device inside it.
// raise_on_hazard: RaceError from the call that found the first hazard (the operation is not enqueued);
// otherwise s.hazards collects them.
struct SanitizerScope {
  std::shared_ptr<PyDevice> dev;
  rt::SanitizerOptions options;
  std::shared_ptr<rt::Sanitizer> sanitizer;
  std::vector<Hazard> collected;

  std::vector<Hazard> hazards() {
    if (sanitizer)
      for (const rt::RaceReport& r : sanitizer->take_reports())
        collected.push_back({rt::to_string(r.kind), r.message, r.current.op, r.current.stream_name, r.previous.op,
                             r.previous.stream_name, reinterpret_cast<uintptr_t>(r.ptr), r.bytes});
    return collected;
  }
};

}  // namespace

void bind_runtime(py::module_& m) {
  py::class_<PyDevice, std::shared_ptr<PyDevice>>(m, "Device", R"(A CPU device: a pool of worker threads that runs
streams of operations with CUDA's semantics. workers=0: one per core; pin: worker w on the w-th allowed CPU.)")
      .def(py::init([](int workers, bool pin, int spin_us, int spin_while_running_us) {
             if (workers < 0) throw std::invalid_argument("workers: expected >= 0 (0: one per core), got " + std::to_string(workers));
             rt::CpuDeviceOptions o;
             o.num_workers = workers;
             o.pin_workers = pin;
             o.spin_us = spin_us;
             o.spin_while_running_us = spin_while_running_us;
             return std::make_shared<PyDevice>(PyDevice{rt::make_cpu_device(o)});
           }),
           py::arg("workers") = 2, py::arg("pin") = true, py::arg("spin_us") = rt::CpuDeviceOptions{}.spin_us,
           py::arg("spin_while_running_us") = rt::CpuDeviceOptions{}.spin_while_running_us)
      .def_property_readonly("workers", [](const PyDevice& d) { return d.get().num_workers(); })
      .def_property_readonly("kind", [](const PyDevice& d) { return d.get().kind(); })
      .def("synchronize",
           [](PyDevice& d) {
             py::gil_scoped_release nogil;
             d.get().synchronize();
             rt::current_stream(d.get()).synchronize();  // rethrows the current stream's error, if any
           },
           "Blocks until every stream is idle; raises StreamError for a failure on the current stream.")
      .def("create_stream",
           [](PyDevice& d, int priority, std::string name) {
             return PyStream{d.get().create_stream(priority, std::move(name)), {}};
           },
           py::arg("priority") = rt::kPriorityDefault, py::arg("name") = "",
           "A new stream (lower number = higher priority, as CUDA); `with stream:` makes it current.")
      .def_property_readonly("default_stream", [](PyDevice& d) { return PyStream{d.get().default_stream(), {}}; })
      .def("current_stream", [](PyDevice& d) { return PyStream{rt::current_stream(d.get()), {}}; },
           "The calling thread's current stream: the innermost `with stream:`, else the default stream.")
      .def(
          "trace",
          [](std::shared_ptr<PyDevice> d, std::string path, std::string svg, std::string title) {
            return TraceScope{std::move(d), std::move(path), std::move(svg), std::move(title), std::nullopt};
          },
          py::arg("path"), py::arg("svg") = "", py::arg("title") = "moe_overlap trace",
          "Context manager: traces the device's operations inside it; writes Chrome trace JSON to path at exit.")
      .def("__repr__", [](const PyDevice& d) {
        return "moe_overlap.Device(workers=" + std::to_string(d.get().num_workers()) + ")";
      });

  py::class_<PyStream>(m, "Stream", "A stream of a Device (runtime.h). Copies share the stream.")
      .def("synchronize",
           [](PyStream& s) {
             py::gil_scoped_release nogil;
             s.stream.synchronize();
           },
           "Blocks until its work is done; raises StreamError for a failure it holds.")
      .def("query", [](const PyStream& s) { return s.stream.query(); }, "True when all its work is done.")
      .def("wait_stream", [](PyStream& s, PyStream& other) { s.stream.wait_stream(other.stream); },
           py::arg("other"), "Later work on this stream waits for the work enqueued on `other` so far.")
      .def_property_readonly("id", [](const PyStream& s) { return s.stream.id(); })
      .def_property_readonly("name", [](const PyStream& s) { return s.stream.name(); })
      .def_property_readonly("priority", [](const PyStream& s) { return s.stream.priority(); })
      .def("__eq__", [](const PyStream& a, const PyStream& b) { return a.stream == b.stream; })
      .def("__enter__",
           [](PyStream& s) -> PyStream& {
             s.guards.push_back(std::make_shared<rt::StreamGuard>(s.stream));
             return s;
           },
           py::return_value_policy::reference)
      .def("__exit__", [](PyStream& s, py::args) {
        if (!s.guards.empty()) s.guards.pop_back();
        return false;
      });

  py::class_<TraceScope>(m, "TraceScope")
      .def("__enter__",
           [](TraceScope& t) -> TraceScope& {
             t.dev->get().set_tracing(true);
             return t;
           },
           py::return_value_policy::reference)
      .def("__exit__",
           [](TraceScope& t, py::object type, py::object, py::object) {
             {
               py::gil_scoped_release nogil;
               t.dev->get().synchronize();
               t.dev->get().set_tracing(false);
               t.trace = t.dev->get().take_trace();
             }
             if (!type.is_none()) return false;  // the block failed: its error, and no file
             tools::write_chrome_trace(*t.trace, t.path);
             if (!t.svg.empty()) tools::write_timeline_svg(*t.trace, t.title, t.svg);
             return false;
           })
      .def_property_readonly("num_ops", [](const TraceScope& t) { return t.trace ? t.trace->ops.size() : 0; })
      .def_property_readonly("path", [](const TraceScope& t) { return t.path; });

  py::class_<Hazard>(m, "Hazard", "One hazard the stream sanitizer found (runtime/sanitizer.h's RaceReport).")
      .def_readonly("kind", &Hazard::kind)
      .def_readonly("message", &Hazard::message)
      .def_readonly("op", &Hazard::op)
      .def_readonly("stream", &Hazard::stream)
      .def_readonly("previous_op", &Hazard::previous_op)
      .def_readonly("previous_stream", &Hazard::previous_stream)
      .def_readonly("ptr", &Hazard::ptr)
      .def_readonly("bytes", &Hazard::bytes)
      .def("__repr__", [](const Hazard& h) { return "<Hazard " + h.message + ">"; });

  py::class_<SanitizerScope>(m, "SanitizerScope")
      .def("__enter__",
           [](SanitizerScope& s) -> SanitizerScope& {
             if (s.sanitizer) throw std::invalid_argument("sanitizer: this scope is already active");
             s.sanitizer = rt::enable_sanitizer(s.dev->get(), s.options);
             return s;
           },
           py::return_value_policy::reference)
      .def("__exit__",
           [](SanitizerScope& s, py::args) {
             s.hazards();
             rt::disable_sanitizer(s.dev->get(), *s.sanitizer);
             s.sanitizer.reset();
             return false;
           })
      .def_property_readonly("hazards", &SanitizerScope::hazards);

  m.def(
      "sanitizer",
      [](std::shared_ptr<PyDevice> d, bool raise_on_hazard, bool check_uninitialized) {
        SanitizerScope s;
        s.dev = std::move(d);
        s.options.throw_on_first = raise_on_hazard;
        s.options.check_uninitialized = check_uninitialized;
        return s;
      },
      py::arg("device"), py::arg("raise_on_hazard") = true, py::arg("check_uninitialized") = true,
      R"(Context manager: the stream sanitizer on `device` for the calls inside it. raise_on_hazard: RaceError at
the call that found the first hazard; else `s.hazards` lists them. Not thread-safe against calls on the device
from other threads.)");
}

}  // namespace moe::py_api
