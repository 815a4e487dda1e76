#include "array_weights.h"

#include <pybind11/numpy.h>

#include <memory>
#include <string>

#include "arrays.h"
#include "io/checkpoint.h"
#include "model/host_buffer.h"

namespace moe::py_api {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

enum class Kind : uint8_t { kF32, kBF16, kF8, kOther };
const char* kind_name(Kind k) {
  return k == Kind::kF32 ? "float32" : k == Kind::kBF16 ? "bfloat16" : k == Kind::kF8 ? "float8_e4m3 (uint8)" : "?";
}

struct Tensor {
  std::string name;  // the key it was found under
  Kind kind = Kind::kOther;
  std::string dtype;  // as Python names it, for messages
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

class Reader {
 public:
  Reader(const py::dict& tensors, std::string prefix, std::vector<py::object>& keep, LayerWeights& w)
      : tensors_(tensors), prefix_(std::move(prefix)), keep_(keep), w_(w) {}

  bool has(const std::string& rel) const {
    return tensors_.contains(py::str(prefix_ + rel)) || tensors_.contains(py::str(rel));
  }

  Tensor need(const std::string& rel, const std::vector<int64_t>& shape) {
    std::string key = prefix_ + rel;
    if (!tensors_.contains(py::str(key))) key = rel;
    const std::string packed = rel.size() > 7 ? rel.substr(0, rel.size() - 7) + ".weight_packed" : "";
    if (!tensors_.contains(py::str(key)) && !packed.empty() && has(packed))
      throw ConfigError("weights: '" + prefix_ + packed + "' is int4 (compressed-tensors); Layer(config, weights) takes "
                        "float32, bfloat16 and fp8 arrays: load int4 checkpoints with Layer.from_pretrained(dir)");
    if (!tensors_.contains(py::str(key)))
      throw ConfigError("weights: tensor '" + prefix_ + rel + "' (expected shape " + shape_text(shape) +
                        ") is missing (keys are Hugging Face names, or names relative to '" + prefix_ + "')");
    Tensor t = inspect(key, tensors_[py::str(key)]);
    if (t.shape != shape) fail(t, "has shape " + shape_text(t.shape) + ", expected " + shape_text(shape));
    return t;
  }

  WeightView matrix(const std::string& rel, int64_t rows, int64_t cols, bool allow_fp8 = true) {
    const Tensor t = need(rel, {rows, cols});
    WeightView v;
    v.rows = rows;
    v.cols = cols;
    v.data = t.data;
    switch (t.kind) {
      case Kind::kF32: v.dtype = DType::kF32; break;
      case Kind::kBF16: v.dtype = DType::kBF16; break;
      case Kind::kF8:
        if (allow_fp8) {
          v.dtype = DType::kF8E4M3;
          v.scale_inv = scales(rel + "_scale_inv", rows, cols);
          // No fp8_codes (model/weights.h, attach_fp8_codes): the arrays are used in place and may change
          // after the layer is made, so the kernels classify each block as they read it.
          break;
        }
        [[fallthrough]];
      default:
        fail(t, "has dtype " + t.dtype + ", expected float32, bfloat16" + (allow_fp8 ? " or float8_e4m3 codes (uint8)" : ""));
    }
    return v;
  }

  const float* scales(const std::string& rel, int64_t rows, int64_t cols) {
    const Tensor t = need(rel, {ceil_div(rows, 128), ceil_div(cols, 128)});
    if (t.kind != Kind::kF32) fail(t, "has dtype " + t.dtype + ", expected float32 block scales");
    return static_cast<const float*>(t.data);
  }

  const float* bias(const std::string& rel, int64_t n) {
    const Tensor t = need(rel, {n});
    if (t.kind == Kind::kF32) return static_cast<const float*>(t.data);
    if (t.kind != Kind::kBF16) fail(t, "has dtype " + t.dtype + ", expected float32 (or bfloat16)");
    auto buf = std::make_shared<HostBuffer>(static_cast<size_t>(n) * 4);
    for (int64_t e = 0; e < n; ++e) buf->as<float>()[e] = bf16_to_f32(static_cast<const uint16_t*>(t.data)[e]);
    w_.storage.emplace_back(buf);
    return buf->as<float>();
  }

  // transformers v5 layout: experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I].
  void fused_experts(const MoeConfig& c) {
    const int64_t e = c.num_experts, h = c.hidden, i = c.moe_intermediate;
    const Tensor gu = need("experts.gate_up_proj", {e, 2 * i, h});
    const Tensor dn = need("experts.down_proj", {e, h, i});
    if (gu.kind != Kind::kF32 && gu.kind != Kind::kBF16) fail(gu, "has dtype " + gu.dtype + ", expected float32 or bfloat16");
    if (dn.kind != gu.kind) fail(dn, "has dtype " + dn.dtype + ", unlike experts.gate_up_proj (" + gu.dtype + ")");
    const DType t = gu.kind == Kind::kF32 ? DType::kF32 : DType::kBF16;
    const size_t mat = static_cast<size_t>(h * i) * dtype_size(t);
    auto view = [&](const void* p, int64_t rows, int64_t cols) {
      WeightView v;
      v.dtype = t;
      v.data = p;
      v.rows = rows;
      v.cols = cols;
      return v;
    };
    for (int64_t x = 0; x < e; ++x) {
      const auto* g = static_cast<const uint8_t*>(gu.data) + static_cast<size_t>(x) * 2 * mat;
      w_.experts.push_back({view(g, i, h), view(g + mat, i, h),
                            view(static_cast<const uint8_t*>(dn.data) + static_cast<size_t>(x) * mat, h, i)});
    }
  }

 private:
  [[noreturn]] static void fail(const Tensor& t, const std::string& what) {
    throw ConfigError("weights['" + t.name + "'] " + what);
  }

  Tensor inspect(const std::string& key, py::handle obj) {
    Tensor t;
    t.name = key;
    uintptr_t ptr = 0;
    if (py::isinstance<py::array>(obj)) {
      auto a = py::reinterpret_borrow<py::array>(obj);
      t.dtype = py::str(a.dtype());
      for (py::ssize_t d = 0; d < a.ndim(); ++d) t.shape.push_back(a.shape(d));
      const int flags = py::detail::array_proxy(a.ptr())->flags;
      if (!(flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_))
        fail(t, "is not C-contiguous (np.ascontiguousarray copies it)");
      const char k = a.dtype().kind();
      const py::ssize_t size = a.dtype().itemsize();
      t.kind = k == 'f' && size == 4 ? Kind::kF32 : (k == 'u' || k == 'i') && size == 2 ? Kind::kBF16
               : k == 'u' && size == 1                                       ? Kind::kF8
                                                                             : Kind::kOther;
      ptr = reinterpret_cast<uintptr_t>(a.data());
    } else if (is_tensor(obj)) {
      const TorchTypes& tt = *torch_types();
      std::string d = py::str(obj.attr("dtype"));
      t.dtype = d.rfind("torch.", 0) == 0 ? d.substr(6) : d;
      for (py::handle s : py::tuple(obj.attr("shape"))) t.shape.push_back(s.cast<int64_t>());
      if (std::string(py::str(obj.attr("device").attr("type"))) != "cpu")
        fail(t, "is on device " + std::string(py::str(obj.attr("device"))) + ", expected a CPU tensor");
      if (!obj.attr("is_contiguous")().cast<bool>()) fail(t, "is not contiguous (.contiguous() copies it)");
      py::object dt = obj.attr("dtype");
      t.kind = dt.is(tt.float32) ? Kind::kF32 : dt.is(tt.bfloat16) ? Kind::kBF16
               : dt.is(tt.uint8) || t.dtype == "float8_e4m3fn" ? Kind::kF8
                                                               : Kind::kOther;
      ptr = obj.attr("data_ptr")().cast<uintptr_t>();
    } else {
      fail(t, "is of type " + std::string(py::str(obj.get_type().attr("__name__"))) +
                  ", expected a NumPy array or a torch.Tensor");
    }
    const size_t align = t.kind == Kind::kF32 ? 4 : t.kind == Kind::kBF16 ? 2 : 1;
    if (ptr % align != 0) fail(t, "is misaligned for " + std::string(kind_name(t.kind)));
    t.data = reinterpret_cast<const void*>(ptr);
    keep_.push_back(py::reinterpret_borrow<py::object>(obj));
    return t;
  }

  const py::dict& tensors_;
  std::string prefix_;
  std::vector<py::object>& keep_;
  LayerWeights& w_;
};

}  // namespace

LayerWeights weights_from_arrays(const MoeConfig& c, const py::dict& tensors, int64_t layer,
                                 std::vector<py::object>& keep) {
  if (layer < 0 || layer >= c.num_layers || !c.is_moe_layer(layer))
    throw ConfigError("layer " + std::to_string(layer) + " is not an MoE layer of this config (num_hidden_layers " +
                      std::to_string(c.num_layers) + ")");
  LayerWeights w;
  Reader rd(tensors, layer_prefix(layer), keep, w);
  const int64_t h = c.hidden, i = c.moe_intermediate;
  w.router = rd.matrix("gate.weight", c.num_experts, h, /*allow_fp8=*/false);
  if (c.correction_bias) w.correction_bias = rd.bias("gate.e_score_correction_bias", c.num_experts);
  if (rd.has("experts.gate_up_proj")) {
    rd.fused_experts(c);
  } else {
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string x = "experts." + std::to_string(e) + ".";
      w.experts.push_back({rd.matrix(x + "gate_proj.weight", i, h), rd.matrix(x + "up_proj.weight", i, h),
                           rd.matrix(x + "down_proj.weight", h, i)});
    }
  }
  if (c.has_shared_expert()) {
    const std::string s = c.model_type.rfind("qwen", 0) == 0 ? "shared_expert." : "shared_experts.";
    const int64_t is = c.shared_intermediate;
    w.shared = {rd.matrix(s + "gate_proj.weight", is, h), rd.matrix(s + "up_proj.weight", is, h),
                rd.matrix(s + "down_proj.weight", h, is)};
  }
  if (c.shared_expert_gate) w.shared_gate = rd.matrix("shared_expert_gate.weight", 1, h, /*allow_fp8=*/false);
  w.validate(c);
  return w;
}

}  // namespace moe::py_api
