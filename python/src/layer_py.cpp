// moe_overlap.Layer (layer/moe_layer.h's MoeLayer), its captured graphs (LayerGraph) and asynchronous calls.
// Every call checks its arguments with the GIL held, then releases it while it enqueues and waits.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "array_weights.h"
#include "arrays.h"
#include "bindings.h"
#include "io/hf_config.h"
#include "layer/moe_layer.h"
#include "model_source.h"
#include "tuning_file.h"

namespace moe::py_api {

namespace {

// What a call enqueued that the device may still read or write: kept alive until `done` is reached.
struct Inflight {
  rt::Event done;
  py::object keep;
};

// What a call in flight must keep alive: x, its float32 buffer (if any) and out.
py::tuple keep_alive(const Input& in, const Output& o) {
  return py::make_tuple(in.owner, in.buffer ? in.buffer : py::none(), o.owner);
}

// An enqueued call: its output, an event recorded after it and the stream it went to.
struct AsyncCall {
  py::object out;
  rt::Event done;
  rt::Stream stream;
};

class PyLayer {
 public:
  PyLayer(std::shared_ptr<PyDevice> dev, MoeConfig config, LayerWeights weights, std::vector<py::object> keep,
          std::string label, int64_t layer_index, const LayerOptions& options)
      : dev_(std::move(dev)),
        config_(std::move(config)),
        weights_(std::move(weights)),
        keep_(std::move(keep)),
        label_(std::move(label)),
        layer_index_(layer_index) {
    layer_ = std::make_unique<MoeLayer>(config_, weights_, dev_->get(), options);
  }
  ~PyLayer() {
    {
      py::gil_scoped_release nogil;
      layer_.reset();  // waits for the device: nothing reads the arrays below any more
    }
    inflight_.clear();
  }
  PyLayer(const PyLayer&) = delete;
  PyLayer& operator=(const PyLayer&) = delete;

  py::object call(py::handle x, py::handle out, std::string_view schedule, bool prefill, bool check_input) {
    const Input in = resolve_input(x, config_.hidden, "x");
    const Output o = resolve_output(out, in, config_.hidden, "out");
    const ForwardOptions fo = options(in, schedule, prefill, check_input);
    {
      py::gil_scoped_release nogil;
      std::lock_guard lk(mu_);
      in.convert();
      layer_->forward(in.data, in.tokens, o.data, fo);
      rt::current_stream(dev_->get()).synchronize();
    }
    prune();
    return o.owner;
  }

  // Enqueues and returns at once; the arrays stay alive until the stream reaches the end of the call.
  AsyncCall call_async(py::handle x, py::handle out, std::string_view schedule, bool prefill, bool check_input) {
    const Input in = resolve_input(x, config_.hidden, "x");
    const Output o = resolve_output(out, in, config_.hidden, "out");
    const ForwardOptions fo = options(in, schedule, prefill, check_input);
    rt::Event done;
    rt::Stream s = rt::current_stream(dev_->get());
    {
      py::gil_scoped_release nogil;
      std::lock_guard lk(mu_);
      in.convert();
      layer_->forward(in.data, in.tokens, o.data, fo);
      s.record(done);
    }
    prune();
    inflight_.push_back({done, keep_alive(in, o)});
    return {o.owner, done, s};
  }

  LayerGraph capture(const Input& in, const Output& o, std::string_view schedule, bool prefill) {
    const ForwardOptions fo = options(in, schedule, prefill, false);
    py::gil_scoped_release nogil;
    std::lock_guard lk(mu_);
    return layer_->capture(in.data, in.tokens, o.data, fo);
  }

  // Enqueues a replay (the caller has converted a bf16 input) and records `done` after it.
  void replay(const LayerGraph& g, const Input& in, const Output& o, rt::Event* done, bool wait) {
    py::gil_scoped_release nogil;
    std::lock_guard lk(mu_);
    in.convert();
    rt::Stream s = rt::current_stream(dev_->get());
    layer_->replay(g, in.data, in.tokens, o.data);
    if (done) s.record(*done);
    if (wait) s.synchronize();
  }

  void keep_until(const rt::Event& done, py::object keep) {
    prune();
    inflight_.push_back({done, std::move(keep)});
  }

  void synchronize() {
    {
      py::gil_scoped_release nogil;
      rt::current_stream(dev_->get()).synchronize();
    }
    prune();
  }

  // forward + synchronize timed in C++, `repeats` times (the native cost, beside a call from Python).
  std::vector<double> time_native(const Input& in, const Output& o, std::string_view schedule, int repeats,
                                  bool graph) {
    const ForwardOptions fo = options(in, schedule, false, false);
    std::vector<double> us;
    py::gil_scoped_release nogil;
    std::lock_guard lk(mu_);
    rt::Stream s = rt::current_stream(dev_->get());
    LayerGraph g;
    if (graph) g = layer_->capture(in.data, in.tokens, o.data, fo);
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      if (graph) layer_->replay(g, in.data, in.tokens, o.data);
      else layer_->forward(in.data, in.tokens, o.data, fo);
      s.synchronize();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    return us;
  }

  py::array_t<float> router_weight() const {
    const WeightView& w = weights_.router;
    py::array_t<float> a = new_float_array(w.rows, w.cols);
    float* p = a.mutable_data();
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t c = 0; c < w.cols; ++c) p[r * w.cols + c] = weight_at(w, r, c);
    return a;
  }

  py::dict config_dict() const {
    const MoeConfig& c = config_;
    py::dict d;
    d["model_type"] = c.model_type;
    d["hidden"] = c.hidden;
    d["moe_intermediate"] = c.moe_intermediate;
    d["num_experts"] = c.num_experts;
    d["top_k"] = c.top_k;
    d["shared_intermediate"] = c.shared_intermediate;
    d["shared_expert_gate"] = c.shared_expert_gate;
    d["norm_topk_prob"] = c.norm_topk_prob;
    d["scoring"] = c.scoring == Scoring::kSoftmax ? "softmax" : "sigmoid";
    d["n_group"] = c.n_group;
    d["topk_group"] = c.topk_group;
    d["routed_scaling_factor"] = c.routed_scaling_factor;
    d["fp8"] = c.fp8;
    return d;
  }

  std::string repr() const {
    return "moe_overlap.Layer(" + label_ + ", layer " + std::to_string(layer_index_) + ", H=" +
           std::to_string(config_.hidden) + ", E=" + std::to_string(config_.num_experts) + ", k=" +
           std::to_string(config_.top_k) + ", " + std::string(dtype_name(weight_dtype())) + ", max_tokens=" +
           std::to_string(layer_->max_tokens()) + ")";
  }

  DType weight_dtype() const { return weights_.experts.empty() ? weights_.router.dtype : weights_.experts[0].gate.dtype; }
  const MoeConfig& config() const { return config_; }
  MoeLayer& layer() { return *layer_; }
  const std::string& label() const { return label_; }
  int64_t layer_index() const { return layer_index_; }
  const std::shared_ptr<PyDevice>& device() const { return dev_; }

 private:
  ForwardOptions options(const Input& in, std::string_view schedule, bool prefill, bool check_input) const {
    if (in.tokens > layer_->max_tokens())
      throw std::invalid_argument("x: " + std::to_string(in.tokens) + " tokens, more than this layer's max_tokens=" +
                                  std::to_string(layer_->max_tokens()) + " (pass max_tokens= when building it)");
    return {.schedule = parse_schedule(schedule), .prefill = prefill, .check_input = check_input};
  }

  // Drops what completed calls kept alive (with the GIL).
  void prune() {
    if (inflight_.empty()) return;
    std::erase_if(inflight_, [](const Inflight& f) { return f.done.query(); });
  }

  std::shared_ptr<PyDevice> dev_;  // first: outlives the layer
  MoeConfig config_;
  LayerWeights weights_;
  std::vector<py::object> keep_;  // the arrays behind weights_ (Layer from a dict)
  std::string label_;
  int64_t layer_index_ = 0;
  std::vector<Inflight> inflight_;
  std::mutex mu_;  // one call at a time (MoeLayer is not thread-safe)
  std::unique_ptr<MoeLayer> layer_;
};

// A call in flight: wait() synchronizes the stream it was enqueued on (raising its errors) and returns the output.
struct PyPending {
  py::object layer;  // keeps the layer (and its device) alive
  py::object out;
  rt::Event done;
  rt::Stream stream;
  py::object wait() {
    {
      py::gil_scoped_release nogil;
      stream.synchronize();
    }
    return out;
  }
};

// One captured forward for one token count: replays read x and write out at the captured addresses.
struct PyGraph {
  py::object owner;  // the Layer
  PyLayer* layer = nullptr;
  LayerGraph graph;
  Input in;
  Output out;
};

// The tools' messages name their flags ("--isa: expected ..."); here the same values are keyword arguments.
std::string python_names(std::string what) {
  for (const char* flag : {"--model", "--layer", "--experts", "--dtype", "--isa", "--tuning", "--reread"}) {
    for (size_t at; (at = what.find(flag)) != std::string::npos;) what.erase(at, 2);
  }
  return what;
}

// Runs a tools/ function, rethrowing its invalid_argument with the Python argument names.
template <class F>
auto with_python_names(F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(python_names(e.what()));
  }
}

OverlapPolicy policy_arg(py::handle p) {
  if (p.is_none()) return OverlapPolicy{};
  if (py::isinstance<py::str>(p)) {
    const std::string s = p.cast<std::string>();
    if (s == "env") return OverlapPolicy::from_env();
    if (s == "always") return OverlapPolicy::always();
    if (s == "default") return OverlapPolicy{};
    throw std::invalid_argument("policy: expected an OverlapPolicy, 'default', 'env' or 'always', got '" + s + "'");
  }
  return p.cast<OverlapPolicy>();
}

TuningTable tuning_arg(py::handle t) {
  if (t.is_none()) return {};
  if (py::isinstance<py::str>(t)) return tools::read_tuning_file(t.cast<std::string>());
  TuningTable table;
  for (auto [tokens, schedule] : t.cast<py::dict>())
    table.entries.emplace_back(tokens.cast<int64_t>(), parse_schedule(schedule.cast<std::string>()));
  std::sort(table.entries.begin(), table.entries.end());
  table.validate();
  return table;
}

std::shared_ptr<PyDevice> device_arg(py::handle d) {
  if (d.is_none()) return py::module_::import("moe_overlap").attr("default_device")().cast<std::shared_ptr<PyDevice>>();
  return d.cast<std::shared_ptr<PyDevice>>();
}

LayerOptions layer_options(int64_t max_tokens, const std::string& isa, py::handle policy, py::handle tuning,
                           const std::string& side_stream_tag) {
  if (max_tokens < 1) throw std::invalid_argument("max_tokens: expected >= 1, got " + std::to_string(max_tokens));
  LayerOptions o;
  o.max_tokens = max_tokens;
  o.isa = with_python_names([&] { return tools::kernel_isa(isa); });
  o.policy = policy_arg(policy);
  o.tuning = with_python_names([&] { return tuning_arg(tuning); });
  o.side_stream_tag = side_stream_tag;
  return o;
}

std::string config_json(py::handle config) {
  if (py::isinstance<py::str>(config)) return config.cast<std::string>();
  if (!py::isinstance<py::dict>(config))
    throw std::invalid_argument("config: expected a dict (config.json's fields) or JSON text, got " +
                                std::string(py::str(config.get_type().attr("__name__"))));
  return py::module_::import("json").attr("dumps")(config).cast<std::string>();
}

int64_t first_moe_layer(const MoeConfig& c) {
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (c.is_moe_layer(l)) return l;
  throw ConfigError("config has no MoE layer among its " + std::to_string(c.num_layers) + " layers");
}

}  // namespace

void bind_layer(py::module_& m) {
  py::class_<OverlapPolicy>(m, "OverlapPolicy", R"(When dual and phased fall back to serial (layer/schedule.h):
multi_stream off, a prefill call under decode_only, or more tokens than token_threshold (0: no limit).)")
      .def(py::init([](bool multi_stream, bool decode_only, int64_t token_threshold) {
             if (token_threshold < 0)
               throw std::invalid_argument("token_threshold: expected >= 0, got " + std::to_string(token_threshold));
             return OverlapPolicy{multi_stream, decode_only, token_threshold};
           }),
           py::arg("multi_stream") = true, py::arg("decode_only") = true, py::arg("token_threshold") = 256)
      .def_static("from_env", &OverlapPolicy::from_env,
                  "MOE_OVERLAP_MULTI_STREAM, MOE_OVERLAP_DECODE_ONLY, MOE_OVERLAP_TOKEN_THRESHOLD")
      .def_static("always", &OverlapPolicy::always, "Never falls back.")
      .def_readwrite("multi_stream", &OverlapPolicy::multi_stream)
      .def_readwrite("decode_only", &OverlapPolicy::decode_only)
      .def_readwrite("token_threshold", &OverlapPolicy::token_threshold)
      .def("__repr__", [](const OverlapPolicy& p) {
        return "OverlapPolicy(multi_stream=" + std::string(p.multi_stream ? "True" : "False") +
               ", decode_only=" + (p.decode_only ? "True" : "False") +
               ", token_threshold=" + std::to_string(p.token_threshold) + ")";
      });

  std::vector<std::string> names;
  for (Schedule s : kRunnableSchedules) names.emplace_back(schedule_name(s));
  names.emplace_back(schedule_name(Schedule::kAuto));
  m.attr("SCHEDULES") = py::tuple(py::cast(names));

  py::class_<PyPending>(m, "Pending", "A call in flight (Layer.forward_async, Graph.replay_async).")
      .def("wait", &PyPending::wait,
           "Synchronizes the call's stream (raising StreamError for a failure) and returns the output.")
      .def("done", [](const PyPending& p) { return p.done.query(); }, "True when the call has completed.")
      .def_readonly("out", &PyPending::out);

  py::class_<PyGraph>(m, "Graph", R"(One captured forward (Layer.capture): replay() runs it again after new data
was written into the captured x; x, out and the token count are fixed at capture.)")
      .def("replay",
           [](PyGraph& g) {
             g.layer->replay(g.graph, g.in, g.out, nullptr, true);
             return g.out.owner;
           },
           "Runs the captured forward on the current contents of x and waits; returns out.")
      .def("replay_async",
           [](PyGraph& g) {
             PyPending p{g.owner, g.out.owner, rt::Event(), rt::current_stream(g.layer->device()->get())};
             g.layer->replay(g.graph, g.in, g.out, &p.done, false);
             g.layer->keep_until(p.done, keep_alive(g.in, g.out));
             return p;
           })
      .def_property_readonly("tokens", [](const PyGraph& g) { return g.graph.tokens(); })
      .def_property_readonly("schedule",
                             [](const PyGraph& g) { return std::string(schedule_name(g.graph.decision().schedule)); })
      .def_property_readonly("reason", [](const PyGraph& g) { return g.graph.decision().reason; })
      .def_property_readonly("num_nodes", [](const PyGraph& g) { return g.graph.num_nodes(); })
      .def_property_readonly("input_address",
                             [](const PyGraph& g) { return reinterpret_cast<uintptr_t>(g.graph.input()); },
                             "The address the replays read x from (x's own data, or its float32 buffer for bf16).")
      .def_property_readonly("output_address",
                             [](const PyGraph& g) { return reinterpret_cast<uintptr_t>(g.graph.output()); })
      .def_property_readonly("x", [](const PyGraph& g) { return g.in.owner; })
      .def_property_readonly("out", [](const PyGraph& g) { return g.out.owner; });

  py::class_<PyLayer, std::shared_ptr<PyLayer>>(m, "Layer", R"(The MoE layer of one decoder layer (moe_layer.h).
Layer(config, weights, ...) from config.json's fields and arrays keyed by Hugging Face tensor names;
Layer.from_pretrained(dir_or_preset, ...) from a checkpoint directory or a preset.)")
      .def(py::init([](py::handle config, py::dict weights, py::object layer, py::handle device, int64_t max_tokens,
                       const std::string& isa, py::handle policy, py::handle tuning, const std::string& tag) {
             MoeConfig c = parse_hf_config(config_json(config), "config");
             const int64_t l = layer.is_none() ? first_moe_layer(c) : layer.cast<int64_t>();
             std::vector<py::object> keep;
             LayerWeights w = weights_from_arrays(c, weights, l, keep);
             const LayerOptions o = layer_options(max_tokens, isa, policy, tuning, tag);
             std::string label = "arrays (" + c.model_type + ")";
             return std::make_shared<PyLayer>(device_arg(device), std::move(c), std::move(w), std::move(keep),
                                              std::move(label), l, o);
           }),
           py::arg("config"), py::arg("weights"), py::kw_only(), py::arg("layer") = py::none(),
           py::arg("device") = py::none(), py::arg("max_tokens") = 512, py::arg("isa") = "auto",
           py::arg("policy") = py::none(), py::arg("tuning") = py::none(), py::arg("side_stream_tag") = "11")
      .def_static(
          "from_pretrained",
          [](const std::string& model, int64_t layer, py::handle device, int64_t max_tokens, const std::string& dtype,
             const std::string& isa, int64_t experts, uint64_t seed, py::handle policy, py::handle tuning,
             const std::string& tag) {
            const LayerOptions o = layer_options(max_tokens, isa, policy, tuning, tag);
            std::shared_ptr<PyDevice> dev = device_arg(device);
            tools::ModelOptions mo;
            mo.model = model;
            mo.layer = layer;
            mo.experts = experts;
            mo.dtype = dtype;
            mo.seed = seed;
            tools::LoadedModel lm = [&] {
              py::gil_scoped_release nogil;  // mapping or generating gigabytes
              return with_python_names([&] { return tools::load_model(mo); });
            }();
            return std::make_shared<PyLayer>(std::move(dev), std::move(lm.config), std::move(lm.weights),
                                             std::vector<py::object>{}, lm.label, lm.layer, o);
          },
          py::arg("model"), py::kw_only(), py::arg("layer") = -1, py::arg("device") = py::none(),
          py::arg("max_tokens") = 512, py::arg("dtype") = "auto", py::arg("isa") = "auto", py::arg("experts") = -1,
          py::arg("seed") = 0, py::arg("policy") = py::none(), py::arg("tuning") = py::none(),
          py::arg("side_stream_tag") = "11",
          R"(A checkpoint directory (weights memory-mapped, used as stored) or a preset name (seeded random
weights of the published sizes; dtype 'bf16' | 'f32' | 'fp8' | 'auto'). layer=-1: the first MoE layer;
experts=N keeps experts [0, N) only.)")
      .def("__call__", &PyLayer::call, py::arg("x"), py::kw_only(), py::arg("out") = py::none(),
           py::arg("schedule") = "dual", py::arg("prefill") = false, py::arg("check_input") = false,
           R"(y [tokens, hidden] = MoE(x). x: NumPy float32 or CPU torch float32/bfloat16, C-contiguous; float32 is
read in place, bfloat16 converted once into a buffer. Returns out (or a new array/tensor of x's kind).)")
      .def(
          "forward_async",
          [](std::shared_ptr<PyLayer> self, py::handle x, py::handle out, std::string_view schedule, bool prefill,
             bool check_input) {
            AsyncCall c = self->call_async(x, out, schedule, prefill, check_input);
            return PyPending{py::cast(self), std::move(c.out), c.done, c.stream};
          },
          py::arg("x"), py::kw_only(), py::arg("out") = py::none(), py::arg("schedule") = "dual",
          py::arg("prefill") = false, py::arg("check_input") = false,
          "Enqueues the call and returns a Pending at once; x and out stay alive until it completes.")
      .def("synchronize", &PyLayer::synchronize, "Waits for the current stream; raises StreamError for a failure.")
      .def(
          "capture",
          [](std::shared_ptr<PyLayer> self, py::handle x, py::handle out, std::string_view schedule, bool prefill) {
            PyGraph g;
            g.owner = py::cast(self);
            g.layer = self.get();
            g.in = resolve_input(x, self->config().hidden, "x");
            g.out = resolve_output(out, g.in, self->config().hidden, "out");
            g.graph = self->capture(g.in, g.out, schedule, prefill);
            return g;
          },
          py::arg("x"), py::arg("out") = py::none(), py::kw_only(), py::arg("schedule") = "dual",
          py::arg("prefill") = false, "Captures the forward of exactly x's tokens from x into out (nothing runs).")
      .def(
          "replay",
          [](PyLayer& self, PyGraph& g, py::handle x, py::handle out) {
            Input in = resolve_input(x, self.config().hidden, "x");
            const Output o = resolve_output(out, in, self.config().hidden, "out");
            if (in.bf16 != nullptr && in.bf16 == g.in.bf16) in = g.in;  // the captured tensor: its buffer
            self.replay(g.graph, in, o, nullptr, true);
            return o.owner;
          },
          py::arg("graph"), py::arg("x"), py::arg("out"),
          "Replays `graph`; x and out must be the captured ones (ValueError naming what differs).")
      .def("effective_schedule",
           [](PyLayer& self, int64_t tokens, std::string_view schedule, bool prefill) {
             const ScheduleDecision d = self.layer().effective_schedule(
                 {.schedule = parse_schedule(schedule), .prefill = prefill}, tokens);
             return py::make_tuple(std::string(schedule_name(d.schedule)), d.reason);
           },
           py::arg("tokens"), py::arg("schedule") = "dual", py::arg("prefill") = false,
           "(schedule that runs, why it differs from the request) for a call of `tokens` tokens.")
      .def(
          "time_native",
          [](PyLayer& self, py::handle x, py::handle out, std::string_view schedule, int repeats, bool graph) {
            const Input in = resolve_input(x, self.config().hidden, "x");
            const Output o = resolve_output(out, in, self.config().hidden, "out");
            return self.time_native(in, o, schedule, repeats, graph);
          },
          py::arg("x"), py::arg("out"), py::kw_only(), py::arg("schedule") = "dual", py::arg("repeats") = 100,
          py::arg("graph") = false,
          "Microseconds of each of `repeats` forward+synchronize (or replay+synchronize) timed in C++.")
      .def_property_readonly("router_weight", &PyLayer::router_weight,
                             "The router's weights [E, H] as float32 (a copy).")
      .def_property_readonly("config", &PyLayer::config_dict)
      .def_property_readonly("hidden", [](const PyLayer& s) { return s.config().hidden; })
      .def_property_readonly("num_experts", [](const PyLayer& s) { return s.config().num_experts; })
      .def_property_readonly("has_shared_expert", [](const PyLayer& s) { return s.config().has_shared_expert(); })
      .def_property_readonly("max_tokens", [](PyLayer& s) { return s.layer().max_tokens(); })
      .def_property_readonly("isa", [](PyLayer& s) { return std::string(isa_name(s.layer().options().isa)); })
      .def_property_readonly("dtype", [](const PyLayer& s) { return std::string(dtype_name(s.weight_dtype())); })
      .def_property_readonly("label", &PyLayer::label)
      .def_property_readonly("layer_index", &PyLayer::layer_index)
      .def_property_readonly("device", &PyLayer::device)
      .def_property_readonly("workspace_bytes", [](PyLayer& s) { return s.layer().workspace_bytes(); })
      .def("__repr__", &PyLayer::repr);
}

}  // namespace moe::py_api
