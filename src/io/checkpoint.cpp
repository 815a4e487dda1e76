#include "io/checkpoint.h"

#include <cstring>
#include <set>

#include "io/hf_config.h"
#include "model/host_buffer.h"

namespace moe {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Loader {
 public:
  Loader(TensorStore& store, LayerWeights& w, bool int4) : store_(store), w_(w), int4_(int4) {}

  TensorStore::Found need(const std::string& name, const std::vector<int64_t>& shape) {
    auto f = store_.find(name);
    if (!f)
      throw IoError("tensor '" + name + "' (expected shape " + shape_to_string(shape) + ") not found in '" +
                    store_.source() + "'");
    if (f->info->shape != shape)
      fail(*f, "has shape " + f->info->shape_str() + ", expected " + shape_to_string(shape));
    if (kept_.insert(f->file.get()).second) w_.storage.emplace_back(f->file);
    return *f;
  }

  [[noreturn]] static void fail(const TensorStore::Found& f, const std::string& what) {
    throw IoError("tensor '" + f.info->name + "' in '" + f.file->path() + "' " + what);
  }

  static DType weight_dtype(const TensorStore::Found& f, bool allow_fp8) {
    switch (f.info->dtype) {
      case StDType::kF32: return DType::kF32;
      case StDType::kBF16: return DType::kBF16;
      case StDType::kF8E4M3:
        if (allow_fp8) return DType::kF8E4M3;
        break;
      default: break;
    }
    fail(f, "has dtype " + std::string(st_dtype_name(f.info->dtype)) + ", expected " +
                (allow_fp8 ? "F32, BF16 or F8_E4M3" : "F32 or BF16"));
  }

  // Mapped bytes are used in place when aligned for their element type. A writer that does not pad its header
  // to 8 bytes leaves them misaligned; such a tensor is copied rather than read through a misaligned pointer.
  const void* aligned(const TensorStore::Found& f, size_t align) {
    if (reinterpret_cast<uintptr_t>(f.data) % align == 0) return f.data;
    auto buf = std::make_shared<HostBuffer>(f.info->bytes());
    std::memcpy(buf->data(), f.data, f.info->bytes());
    w_.storage.emplace_back(buf);
    return buf->data();
  }

  WeightView matrix(const std::string& name, int64_t rows, int64_t cols, bool allow_fp8 = true) {
    const std::string module = name.substr(0, name.size() - std::strlen(".weight"));
    if (!store_.contains(name) && store_.contains(module + ".weight_packed"))
      throw IoError("tensor '" + name + "' (expected shape " + shape_to_string({rows, cols}) + ") not found in '" +
                    store_.source() + "': '" + module + "' is stored as int4 (weight_packed), but config.json's "
                    "quantization_config " + (int4_ ? "lists it in ignore (bf16)" : "does not quantize it to int4"));
    auto f = need(name, {rows, cols});
    WeightView v;
    v.dtype = weight_dtype(f, allow_fp8);
    v.rows = rows;
    v.cols = cols;
    v.data = aligned(f, dtype_size(v.dtype));
    if (v.dtype == DType::kF8E4M3) v.scale_inv = scales(name + "_scale_inv", rows, cols);
    attach_fp8_codes(v, w_.storage);
    return v;
  }

  // compressed-tensors pack-quantized int4: <module>.weight_packed I32 [rows, cols / 8],
  // <module>.weight_scale BF16 [rows, cols / group], <module>.weight_shape I32/I64 [2] = [rows, cols]. Used as
  // mapped (aligned for their element types), never unpacked.
  WeightView int4_matrix(const std::string& module, int64_t rows, int64_t cols, int64_t group) {
    const std::string packed = module + ".weight_packed";
    if (!store_.contains(packed) && store_.contains(module + ".weight"))
      throw IoError("tensor '" + packed + "' (expected I32 " + shape_to_string({rows, cols / kInt4PerWord}) +
                    ") not found in '" + store_.source() + "': '" + module + ".weight' is stored unquantized, but "
                    "config.json's quantization_config quantizes '" + module + "' to int4 (it is not in ignore)");
    auto shape = need(module + ".weight_shape", {2});
    int64_t dims[2] = {0, 0};
    if (shape.info->dtype == StDType::kI64) {
      std::memcpy(dims, shape.data, sizeof dims);
    } else if (shape.info->dtype == StDType::kI32) {
      int32_t d32[2];
      std::memcpy(d32, shape.data, sizeof d32);
      dims[0] = d32[0];
      dims[1] = d32[1];
    } else {
      fail(shape, "has dtype " + std::string(st_dtype_name(shape.info->dtype)) + ", expected I32 or I64");
    }
    if (dims[0] != rows || dims[1] != cols)
      fail(shape, "holds " + shape_to_string({dims[0], dims[1]}) + ", expected " + shape_to_string({rows, cols}) +
                      " (the config's [out, in] of this projection)");
    auto p = need(packed, {rows, cols / kInt4PerWord});
    if (p.info->dtype != StDType::kI32)
      fail(p, "has dtype " + std::string(st_dtype_name(p.info->dtype)) + ", expected I32 (eight int4 per word)");
    auto sc = need(module + ".weight_scale", {rows, cols / group});
    if (sc.info->dtype != StDType::kBF16)
      fail(sc, "has dtype " + std::string(st_dtype_name(sc.info->dtype)) + ", expected BF16 group scales (group_size " +
                   std::to_string(group) + ")");
    WeightView v;
    v.dtype = DType::kInt4;
    v.rows = rows;
    v.cols = cols;
    v.data = aligned(p, 4);
    v.group_scale = static_cast<const uint16_t*>(aligned(sc, 2));
    v.group_size = group;
    return v;
  }

  const float* scales(const std::string& name, int64_t rows, int64_t cols) {
    auto f = need(name, {ceil_div(rows, 128), ceil_div(cols, 128)});
    if (f.info->dtype != StDType::kF32)
      fail(f, "has dtype " + std::string(st_dtype_name(f.info->dtype)) + ", expected F32 block scales");
    return static_cast<const float*>(aligned(f, 4));
  }

  const float* bias(const std::string& name, int64_t n) {
    auto f = need(name, {n});
    if (f.info->dtype == StDType::kF32) return static_cast<const float*>(aligned(f, 4));
    if (f.info->dtype != StDType::kBF16)
      fail(f, "has dtype " + std::string(st_dtype_name(f.info->dtype)) + ", expected F32 (or BF16)");
    auto buf = std::make_shared<HostBuffer>(static_cast<size_t>(n) * 4);
    const auto* src = static_cast<const uint8_t*>(f.data);
    for (int64_t e = 0; e < n; ++e) {
      uint16_t h;
      std::memcpy(&h, src + 2 * e, 2);
      buf->as<float>()[e] = bf16_to_f32(h);
    }
    w_.storage.emplace_back(buf);
    return buf->as<float>();
  }

  // transformers v5 layout: experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I].
  void fused_experts(const std::string& p, const MoeConfig& c, int64_t first, int64_t n_local) {
    const int64_t e = c.num_experts, h = c.hidden, i = c.moe_intermediate;
    auto gu = need(p + "experts.gate_up_proj", {e, 2 * i, h});
    auto dn = need(p + "experts.down_proj", {e, h, i});
    const DType t = weight_dtype(gu, false);
    if (weight_dtype(dn, false) != t) fail(dn, "has a different dtype than experts.gate_up_proj");
    const auto* gu_base = static_cast<const uint8_t*>(aligned(gu, dtype_size(t)));
    const auto* dn_base = static_cast<const uint8_t*>(aligned(dn, dtype_size(t)));
    const size_t sz = dtype_size(t), mat = static_cast<size_t>(h * i) * sz;
    for (int64_t x = first; x < first + n_local; ++x) {
      auto view = [&](const uint8_t* p_, int64_t rows, int64_t cols) {
        WeightView v;
        v.dtype = t;
        v.data = p_;
        v.rows = rows;
        v.cols = cols;
        return v;
      };
      const uint8_t* g = gu_base + static_cast<size_t>(x) * 2 * mat;
      w_.experts.push_back({view(g, i, h), view(g + mat, i, h), view(dn_base + static_cast<size_t>(x) * mat, h, i)});
    }
  }

 private:
  TensorStore& store_;
  LayerWeights& w_;
  bool int4_;
  std::set<const SafetensorsFile*> kept_;
};

void check_layer(const ModelDir& dir, int64_t layer, int64_t first, int64_t n_local) {
  const MoeConfig& c = dir.config();
  if (layer < 0 || layer >= c.num_layers)
    throw IoError("layer " + std::to_string(layer) + " of '" + dir.dir() + "' is out of range (num_hidden_layers " +
                  std::to_string(c.num_layers) + ")");
  if (!c.is_moe_layer(layer))
    throw IoError("layer " + std::to_string(layer) + " of '" + dir.dir() + "' is a dense layer for model_type " +
                  c.model_type + " (first_k_dense_replace " + std::to_string(c.first_k_dense_replace) +
                  ", decoder_sparse_step " + std::to_string(c.decoder_sparse_step) +
                  ", mlp_only_layers / mlp_layer_types); it has no MoE weights");
  if (first < 0 || n_local < 1 || first + n_local > c.num_experts)
    throw IoError("experts [" + std::to_string(first) + ", " + std::to_string(first + n_local) +
                  ") do not fit in the " + std::to_string(c.num_experts) + " experts of '" + dir.dir() + "'");
}

}  // namespace

std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + ".mlp."; }

ModelDir::ModelDir(const std::string& dir) : dir_(dir), config_(load_hf_config(dir)), store_(dir) {}

ModelDir::ModelDir(const std::string& dir, const MoeConfig& config) : dir_(dir), config_(config), store_(dir) {
  config_.validate();
}

LayerWeights load_layer(ModelDir& dir, int64_t layer, int64_t num_local_experts, int64_t first_expert) {
  const MoeConfig& c = dir.config();
  const int64_t n_local = num_local_experts < 0 ? c.num_experts - first_expert : num_local_experts;
  check_layer(dir, layer, first_expert, n_local);
  const std::string p = layer_prefix(layer);
  const int64_t h = c.hidden, i = c.moe_intermediate;
  LayerWeights w;
  w.first_expert = first_expert;
  Loader ld(dir.tensors(), w, c.int4);
  w.router = ld.matrix(p + "gate.weight", c.num_experts, h, /*allow_fp8=*/false);
  if (c.correction_bias) w.correction_bias = ld.bias(p + "gate.e_score_correction_bias", c.num_experts);
  // One SwiGLU's three projections, int4 or as stored.
  const auto expert = [&](const std::string& x, int64_t inter, bool int4) -> ExpertWeights {
    if (int4)
      return {ld.int4_matrix(x + "gate_proj", inter, h, c.int4_group_size),
              ld.int4_matrix(x + "up_proj", inter, h, c.int4_group_size),
              ld.int4_matrix(x + "down_proj", h, inter, c.int4_group_size)};
    return {ld.matrix(x + "gate_proj.weight", inter, h), ld.matrix(x + "up_proj.weight", inter, h),
            ld.matrix(x + "down_proj.weight", h, inter)};
  };
  if (dir.tensors().contains(p + "experts.gate_up_proj")) {
    if (c.int4)
      throw IoError("tensor '" + p + "experts.gate_up_proj' in '" + dir.tensors().source() + "': the fused expert "
                    "layout is read for bf16/f32 only, but config.json quantizes the routed experts to int4");
    ld.fused_experts(p, c, first_expert, n_local);
  } else {
    for (int64_t e = first_expert; e < first_expert + n_local; ++e)
      w.experts.push_back(expert(p + "experts." + std::to_string(e) + ".", i, c.int4));
  }
  if (c.has_shared_expert()) {
    const bool qwen = c.model_type.rfind("qwen", 0) == 0;
    w.shared = expert(p + (qwen ? "shared_expert." : "shared_experts."), c.shared_intermediate, c.int4 && c.int4_shared);
  }
  if (c.shared_expert_gate) w.shared_gate = ld.matrix(p + "shared_expert_gate.weight", 1, h, /*allow_fp8=*/false);
  w.validate(c);
  return w;
}

LayerWeights load_layer(const std::string& model_dir, const MoeConfig& config, int64_t layer,
                        int64_t num_local_experts, int64_t first_expert) {
  ModelDir dir(model_dir, config);
  return load_layer(dir, layer, num_local_experts, first_expert);
}

}  // namespace moe
