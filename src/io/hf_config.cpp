// GCC 12 at -O1 with the sanitizers reports a false -Wmaybe-uninitialized inside libstdc++'s <regex>
// (std::function moves in _NFA::_M_insert_*), instantiated by the ignore-list patterns below.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "io/hf_config.h"

#include <cfloat>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include "io/json_util.h"

namespace moe {

namespace {

using nlohmann::json;

// transformers' defaults per model_type (configuration_*.py); k < 0: no default (DeepseekV2Config has None).
struct FamilyDefaults {
  int64_t hidden, moe_intermediate, num_experts, top_k, shared, num_layers;
  int64_t n_group, topk_group, first_k_dense_replace;
  float routed_scaling_factor;
  bool norm_topk_prob;
};

bool is_qwen(const std::string& t) { return t == "qwen2_moe" || t == "qwen3_moe" || t == "qwen3_next"; }
bool is_v3_like(const std::string& t) { return t != "deepseek_v2" && !is_qwen(t); }

FamilyDefaults defaults_for(const std::string& t) {
  // shared: Qwen shared_expert_intermediate_size; DeepSeek family n_shared_experts.
  if (t == "qwen2_moe") return {2048, 1408, 60, 4, 5632, 24, 1, 1, 0, 1.0f, false};
  if (t == "qwen3_moe") return {2048, 768, 128, 8, 0, 24, 1, 1, 0, 1.0f, false};
  if (t == "qwen3_next") return {2048, 512, 512, 10, 512, 48, 1, 1, 0, 1.0f, true};
  if (t == "deepseek_v2") return {4096, 1407, 64, -1, 2, 32, 1, 1, 0, 1.0f, false};
  if (t == "glm4_moe") return {4096, 1408, 128, 8, 1, 46, 1, 1, 1, 1.0f, true};
  if (t == "glm_moe_dsa") return {6144, 2048, 256, 8, 1, 78, 1, 1, 3, 2.5f, true};
  return {7168, 2048, 256, 8, 1, 61, 8, 4, 3, 2.5f, true};  // deepseek_v3, deepseek_v32, kimi_k2
}

const char* architecture_for(const std::string& t) {
  if (t == "qwen2_moe") return "Qwen2MoeForCausalLM";
  if (t == "qwen3_moe") return "Qwen3MoeForCausalLM";
  if (t == "qwen3_next") return "Qwen3NextForCausalLM";
  if (t == "deepseek_v2") return "DeepseekV2ForCausalLM";
  if (t == "deepseek_v32") return "DeepseekV32ForCausalLM";
  if (t == "glm4_moe") return "Glm4MoeForCausalLM";
  if (t == "glm_moe_dsa") return "GlmMoeDsaForCausalLM";
  return "DeepseekV3ForCausalLM";  // deepseek_v3, kimi_k2
}

// Typed access to config.json fields; absent and null both mean "use the default".
class Fields {
 public:
  Fields(const json& j, const std::string& source, std::string prefix = "")
      : j_(j), source_(source), prefix_(std::move(prefix)) {}

  [[noreturn]] void bad(const std::string& field, const std::string& what) const {
    throw ConfigError(source_ + ": field '" + prefix_ + field + "' " + what);
  }
  const json* get(const std::string& field) const {
    auto it = j_.find(field);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t integer(const std::string& field, int64_t def) const {
    const json* v = get(field);
    if (v == nullptr) {
      if (def < 0) bad(field, "is required for this model_type");
      return def;
    }
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}))
      bad(field, "must be an integer, got " + json_type_name(*v) + " " + v->dump());
    return v->get<int64_t>();
  }
  bool boolean(const std::string& field, bool def) const {
    const json* v = get(field);
    if (v == nullptr) return def;
    if (!v->is_boolean()) bad(field, "must be true or false, got " + json_type_name(*v) + " " + v->dump());
    return v->get<bool>();
  }
  float number(const std::string& field, float def) const {
    const json* v = get(field);
    if (v == nullptr) return def;
    if (!v->is_number()) bad(field, "must be a number, got " + json_type_name(*v) + " " + v->dump());
    const double x = v->get<double>();
    if (!(std::fabs(x) <= static_cast<double>(FLT_MAX))) bad(field, "is out of range for a float: " + v->dump());
    return static_cast<float>(x);
  }
  std::string string(const std::string& field, const std::string& def) const {
    const json* v = get(field);
    if (v == nullptr) return def;
    if (!v->is_string()) bad(field, "must be a string, got " + json_type_name(*v) + " " + v->dump());
    return v->get<std::string>();
  }
  std::vector<int64_t> int_list(const std::string& field) const {
    std::vector<int64_t> out;
    const json* v = get(field);
    if (v == nullptr) return out;
    if (!v->is_array()) bad(field, "must be a list of integers, got " + json_type_name(*v));
    for (const auto& e : *v) {
      if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > uint64_t{INT64_MAX}))
        bad(field, "must be a list of integers, has " + e.dump());
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  std::vector<std::string> string_list(const std::string& field) const {
    std::vector<std::string> out;
    const json* v = get(field);
    if (v == nullptr) return out;
    if (!v->is_array()) bad(field, "must be a list of strings, got " + json_type_name(*v));
    for (const auto& e : *v) {
      if (!e.is_string()) bad(field, "must be a list of strings, has " + e.dump());
      out.push_back(e.get<std::string>());
    }
    return out;
  }

 private:
  const json& j_;
  const std::string& source_;
  std::string prefix_;
};

// The compressed-tensors ignore list: exact module names, and "re:" patterns matched from the start of the
// name (Python's re.match, as compressed-tensors does).
class IgnoreList {
 public:
  IgnoreList(const Fields& f, const std::vector<std::string>& entries) {
    for (const std::string& e : entries) {
      if (e.rfind("re:", 0) != 0) {
        exact_.push_back(e);
        continue;
      }
      try {
        patterns_.push_back({e, std::regex(e.substr(3), std::regex::ECMAScript | std::regex::optimize)});
      } catch (const std::regex_error& err) {
        f.bad("ignore", "entry '" + e + "' is not a valid regular expression: " + err.what());
      }
    }
  }
  // The entry that covers `module`, or nullptr.
  const std::string* match(const std::string& module) const {
    for (const std::string& e : exact_)
      if (e == module) return &e;
    for (const auto& [entry, re] : patterns_)
      if (std::regex_search(module, re, std::regex_constants::match_continuous)) return &entry;
    return nullptr;
  }

 private:
  std::vector<std::string> exact_;
  std::vector<std::pair<std::string, std::regex>> patterns_;
};

std::string module_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + ".mlp."; }
const char* const kProjections[] = {"gate_proj", "up_proj", "down_proj"};

// Which modules of every MoE layer the ignore list keeps in bf16: Qwen's router and shared-expert gate must
// be (they are nn.Linear modules, which the "Linear" target would quantize); the DeepSeek-style routers
// (DeepSeek, Kimi, GLM: a gate module holding a bare weight, not a Linear) are never targeted, so they need
// no entry, as Kimi-K2-Thinking's list has none. No routed expert may be listed; the shared expert's three
// projections are all int4 or all bf16, the same in every layer.
void check_ignore(const Fields& qf, const IgnoreList& ignore, MoeConfig& c) {
  bool first = true;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const std::string p = module_prefix(l);
    const auto must_ignore = [&](const std::string& m, const char* what) {
      if (ignore.match(m) == nullptr)
        qf.bad("ignore", "does not list '" + m + "': " + what + " must stay bf16 (int4 runs the experts only); add it, "
               "or a pattern such as \"re:.*mlp\\\\.gate$\"");
    };
    if (is_qwen(c.model_type)) must_ignore(p + "gate", "the router");
    if (c.shared_expert_gate) must_ignore(p + "shared_expert_gate", "the shared-expert gate");
    for (int64_t e = 0; e < c.num_experts; ++e)
      for (const char* proj : kProjections) {
        const std::string m = p + "experts." + std::to_string(e) + "." + proj;
        if (const std::string* hit = ignore.match(m))
          qf.bad("ignore", "entry '" + *hit + "' leaves routed expert '" + m + "' unquantized: every routed expert "
                 "must be int4 (a layer runs one expert dtype)");
      }
    if (!c.has_shared_expert()) continue;
    const std::string s = p + (is_qwen(c.model_type) ? "shared_expert." : "shared_experts.");
    int ignored = 0;
    std::string kept, quantized;
    for (const char* proj : kProjections) {
      if (ignore.match(s + proj)) {
        ++ignored;
        kept = s + proj;
      } else {
        quantized = s + proj;
      }
    }
    if (ignored != 0 && ignored != 3)
      qf.bad("ignore", "lists '" + kept + "' but not '" + quantized + "': the shared expert's projections must be all "
             "int4 or all bf16");
    const bool shared_int4 = ignored == 0;
    if (!first && shared_int4 != c.int4_shared)
      qf.bad("ignore", "keeps '" + s + "*' " + (shared_int4 ? "int4" : "bf16") + " but the shared experts of earlier "
             "MoE layers " + (shared_int4 ? "bf16" : "int4") + ": every layer must use one dtype for them");
    c.int4_shared = shared_int4;
    first = false;
  }
}

// compressed-tensors pack-quantized int4: one config group of symmetric group-wise int4 weights on Linear
// modules, fp32 activations (no activation quantisation).
void parse_compressed_tensors(const Fields& qf, const json& q, MoeConfig& c, const std::string& source) {
  const std::string format = qf.string("format", "");
  if (format != "pack-quantized")
    qf.bad("format", "'" + format + "' is not supported (only pack-quantized: int4 packed eight to an int32)");
  const json* groups = qf.get("config_groups");
  if (groups == nullptr || !groups->is_object() || groups->size() != 1)
    qf.bad("config_groups", "must be an object with exactly one group, got " +
                                (groups == nullptr ? std::string("none") : groups->dump()));
  const std::string gname = groups->begin().key();
  const json& group = groups->begin().value();
  if (!group.is_object()) qf.bad("config_groups." + gname, "must be an object, got " + json_type_name(group));
  const Fields gf(group, source, "quantization_config.config_groups." + gname + ".");
  const std::vector<std::string> targets = gf.string_list("targets");
  if (targets != std::vector<std::string>{"Linear"})
    gf.bad("targets", "must be [\"Linear\"] (modules chosen by the ignore list), got " +
                          (gf.get("targets") ? gf.get("targets")->dump() : std::string("none")));
  for (const char* act : {"input_activations", "output_activations"})
    if (gf.get(act) != nullptr)
      gf.bad(act, "must be null: quantised (static or dynamic) activations are not supported, they stay fp32; got " +
                      gf.get(act)->dump());
  const std::string group_format = gf.string("format", format);
  if (group_format != "pack-quantized") gf.bad("format", "'" + group_format + "' is not supported (only pack-quantized)");
  const json* weights = gf.get("weights");
  if (weights == nullptr || !weights->is_object()) gf.bad("weights", "must be an object");
  const Fields wf(*weights, source, "quantization_config.config_groups." + gname + ".weights.");
  const int64_t bits = wf.integer("num_bits", -1);
  if (bits != 4) wf.bad("num_bits", "must be 4 (int4), got " + std::to_string(bits));
  const std::string type = wf.string("type", "int");
  if (type != "int") wf.bad("type", "must be 'int', got '" + type + "'");
  if (!wf.boolean("symmetric", true))
    wf.bad("symmetric", "must be true: asymmetric int4 (a zero point per group) is not supported");
  const std::string strategy = wf.string("strategy", "");
  if (strategy != "group") wf.bad("strategy", "must be 'group' (one scale per group of input columns), got '" + strategy + "'");
  if (wf.boolean("dynamic", false)) wf.bad("dynamic", "must be false: dynamic quantisation is not supported");
  if (wf.get("actorder") != nullptr)
    wf.bad("actorder", "must be null (columns in order; no weight_g_idx), got " + wf.get("actorder")->dump());
  c.int4_group_size = wf.integer("group_size", -1);
  if (c.int4_group_size < 32 || (c.int4_group_size & (c.int4_group_size - 1)) != 0)
    wf.bad("group_size", "must be a power of two >= 32, got " + std::to_string(c.int4_group_size));
  for (const auto& [row, name] : {std::pair{c.hidden, "hidden_size"}, std::pair{c.moe_intermediate, "moe_intermediate_size"}})
    if (row % c.int4_group_size != 0)
      wf.bad("group_size", std::to_string(c.int4_group_size) + " does not divide the rows of the experts (" + name +
                               " " + std::to_string(row) + ")");
  c.int4 = true;
  try {
    c.validate();  // the layer fields (is_moe_layer reads them) before walking the modules
  } catch (const ConfigError& e) {
    throw ConfigError(source + ": " + e.what());
  }
  check_ignore(qf, IgnoreList(qf, qf.string_list("ignore")), c);
}

void parse_quantization(const Fields& f, MoeConfig& c, const std::string& source) {
  const json* q = f.get("quantization_config");
  if (q == nullptr) return;
  if (!q->is_object()) f.bad("quantization_config", "must be an object, got " + json_type_name(*q));
  Fields qf(*q, source, "quantization_config.");
  const std::string method = qf.string("quant_method", "");
  if (method == "compressed-tensors") return parse_compressed_tensors(qf, *q, c, source);
  if (method != "fp8")
    qf.bad("quant_method", "'" + method + "' is not supported (fp8 e4m3 with 128x128 weight blocks, or "
                           "compressed-tensors pack-quantized int4)");
  const std::string fmt = qf.string("fmt", "e4m3");
  if (fmt != "e4m3") qf.bad("fmt", "'" + fmt + "' is not supported (only e4m3)");
  const std::vector<int64_t> block = qf.int_list("weight_block_size");
  if (block.size() != 2) qf.bad("weight_block_size", "must be [rows, cols] (per-tensor fp8 is not supported)");
  c.fp8 = true;
  c.block_rows = block[0];
  c.block_cols = block[1];
}

void parse_qwen(const Fields& f, const FamilyDefaults& d, MoeConfig& c) {
  c.num_experts = f.integer("num_experts", d.num_experts);
  if (c.model_type != "qwen3_moe") {
    c.shared_intermediate = f.integer("shared_expert_intermediate_size", d.shared);
    c.shared_expert_gate = c.shared_intermediate > 0;
  }
  c.decoder_sparse_step = f.integer("decoder_sparse_step", 1);
  c.mlp_only_layers = f.int_list("mlp_only_layers");
}

void parse_deepseek(const Fields& f, const FamilyDefaults& d, MoeConfig& c) {
  c.num_experts = f.integer("n_routed_experts", d.num_experts);
  const int64_t n_shared = f.integer("n_shared_experts", d.shared);
  if (n_shared < 0) f.bad("n_shared_experts", "must be >= 0, got " + std::to_string(n_shared));
  if (c.moe_intermediate > 0 && n_shared > INT64_MAX / c.moe_intermediate)
    f.bad("n_shared_experts", "times moe_intermediate_size overflows");
  c.shared_intermediate = c.moe_intermediate > 0 ? n_shared * c.moe_intermediate : 0;
  c.n_group = f.integer("n_group", d.n_group);
  c.topk_group = f.integer("topk_group", d.topk_group);
  c.routed_scaling_factor = f.number("routed_scaling_factor", d.routed_scaling_factor);
  c.first_k_dense_replace = f.integer("first_k_dense_replace", d.first_k_dense_replace);
  c.moe_layer_freq = f.integer("moe_layer_freq", 1);
  c.mlp_layer_types = f.string_list("mlp_layer_types");
  const std::string method = f.string("topk_method", is_v3_like(c.model_type) ? "noaux_tc" : "greedy");
  const std::string scoring = f.string("scoring_func", is_v3_like(c.model_type) ? "sigmoid" : "softmax");
  if (is_v3_like(c.model_type)) {
    // transformers hard-codes sigmoid + noaux_tc for these; a config saying otherwise is not that model.
    if (method != "noaux_tc") f.bad("topk_method", "must be 'noaux_tc' for model_type " + c.model_type + ", got '" + method + "'");
    if (scoring != "sigmoid") f.bad("scoring_func", "must be 'sigmoid' for model_type " + c.model_type + ", got '" + scoring + "'");
    return;
  }
  if (method == "greedy") {
    c.topk_method = TopkMethod::kGreedy;
  } else if (method == "group_limited_greedy") {
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  } else {
    f.bad("topk_method", "must be 'greedy' or 'group_limited_greedy' for deepseek_v2, got '" + method + "'");
  }
  if (scoring != "softmax") f.bad("scoring_func", "must be 'softmax' for deepseek_v2, got '" + scoring + "'");
}

}  // namespace

MoeConfig parse_hf_config(std::string_view text, const std::string& source) {
  json root;
  try {
    root = parse_json_strict(text);
  } catch (const std::runtime_error& e) {
    throw ConfigError(source + ": " + e.what());
  }
  if (!root.is_object()) throw ConfigError(source + ": expected a JSON object, got " + json_type_name(root));
  const Fields f(root, source);
  const json* type = f.get("model_type");
  if (type == nullptr) f.bad("model_type", "is missing");
  if (!type->is_string()) f.bad("model_type", "must be a string, got " + json_type_name(*type));
  MoeConfig c;
  try {
    c = family_defaults(type->get<std::string>());
  } catch (const ConfigError& e) {
    throw ConfigError(source + ": " + e.what());
  }
  const FamilyDefaults d = defaults_for(c.model_type);
  c.hidden = f.integer("hidden_size", d.hidden);
  c.moe_intermediate = f.integer("moe_intermediate_size", d.moe_intermediate);
  c.top_k = f.integer("num_experts_per_tok", d.top_k);
  c.num_layers = f.integer("num_hidden_layers", d.num_layers);
  c.norm_topk_prob = f.boolean("norm_topk_prob", d.norm_topk_prob);
  if (is_qwen(c.model_type)) {
    parse_qwen(f, d, c);
  } else {
    parse_deepseek(f, d, c);
  }
  parse_quantization(f, c, source);
  try {
    c.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(source + ": " + e.what());
  }
  return c;
}

MoeConfig load_hf_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string file = fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError("cannot open '" + file + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return parse_hf_config(s.str(), file);
}

namespace {

[[noreturn]] void inexpressible(const MoeConfig& c, const std::string& what) {
  throw ConfigError("config for model_type " + c.model_type + " cannot be written as config.json: " + what);
}

// The shortest decimal that reads back as the same float (2.827f -> 2.827, not 2.8269999027).
double shortest(float v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::stod(std::string(buf, r.ptr));
}

void put_qwen(const MoeConfig& c, nlohmann::ordered_json& j) {
  if (c.scoring != Scoring::kSoftmax || c.topk_method != TopkMethod::kGreedy || c.n_group != 1 ||
      c.routed_scaling_factor != 1.0f || c.first_k_dense_replace != 0 || c.moe_layer_freq != 1 ||
      !c.mlp_layer_types.empty() || c.correction_bias)
    inexpressible(c, "Qwen routing is plain softmax top-k (no groups, scale, bias or dense prefix)");
  j["num_experts"] = c.num_experts;
  if (c.model_type == "qwen3_moe") {
    if (c.has_shared_expert()) inexpressible(c, "qwen3_moe has no shared expert");
  } else {
    if (c.shared_expert_gate != c.has_shared_expert())
      inexpressible(c, "the Qwen shared expert always has a sigmoid gate");
    j["shared_expert_intermediate_size"] = c.shared_intermediate;
  }
  j["decoder_sparse_step"] = c.decoder_sparse_step;
  j["mlp_only_layers"] = c.mlp_only_layers;
}

void put_deepseek(const MoeConfig& c, nlohmann::ordered_json& j) {
  if (c.decoder_sparse_step != 1 || !c.mlp_only_layers.empty() || c.shared_expert_gate)
    inexpressible(c, "decoder_sparse_step, mlp_only_layers and a shared-expert gate are Qwen fields");
  if (c.shared_intermediate % c.moe_intermediate != 0)
    inexpressible(c, "shared width " + std::to_string(c.shared_intermediate) + " is not n_shared_experts * " +
                         "moe_intermediate_size (" + std::to_string(c.moe_intermediate) + ")");
  const bool v3 = is_v3_like(c.model_type);
  if (v3 != (c.topk_method == TopkMethod::kNoauxTc) || v3 != (c.scoring == Scoring::kSigmoid) ||
      v3 != c.correction_bias)
    inexpressible(c, v3 ? "routing must be sigmoid noaux_tc with a correction bias"
                        : "deepseek_v2 routing is softmax greedy or group_limited_greedy");
  j["n_routed_experts"] = c.num_experts;
  j["n_shared_experts"] = c.shared_intermediate / c.moe_intermediate;
  j["routed_scaling_factor"] = shortest(c.routed_scaling_factor);
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["topk_method"] = c.topk_method == TopkMethod::kNoauxTc              ? "noaux_tc"
                     : c.topk_method == TopkMethod::kGroupLimitedGreedy ? "group_limited_greedy"
                                                                         : "greedy";
  j["scoring_func"] = v3 ? "sigmoid" : "softmax";
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  if (!c.mlp_layer_types.empty()) j["mlp_layer_types"] = c.mlp_layer_types;
}

// Kimi-K2-Thinking's quantization_config: one group of int4 weights on every Linear, and an ignore list of
// what stays bf16 (attention, the shared expert unless int4_shared, and Qwen's Linear routers by name).
nlohmann::ordered_json int4_quantization_config(const MoeConfig& c) {
  nlohmann::ordered_json weights;
  weights["actorder"] = nullptr;
  weights["block_structure"] = nullptr;
  weights["dynamic"] = false;
  weights["group_size"] = c.int4_group_size;
  weights["num_bits"] = 4;
  weights["observer"] = "minmax";
  weights["observer_kwargs"] = nlohmann::ordered_json::object();
  weights["strategy"] = "group";
  weights["symmetric"] = true;
  weights["type"] = "int";
  nlohmann::ordered_json group;
  group["input_activations"] = nullptr;
  group["output_activations"] = nullptr;
  group["targets"] = nlohmann::ordered_json::array({"Linear"});
  group["weights"] = weights;
  nlohmann::ordered_json ignore = nlohmann::ordered_json::array({"lm_head", "re:.*self_attn.*"});
  const bool qwen = is_qwen(c.model_type);
  if (c.has_shared_expert() && !c.int4_shared)
    ignore.push_back(qwen ? "re:.*mlp\\.shared_expert\\..*" : "re:.*mlp\\.shared_experts\\..*");
  if (c.shared_expert_gate) ignore.push_back("re:.*mlp\\.shared_expert_gate$");
  if (qwen)  // a Linear router; DeepSeek-style routers are not Linear modules and need no entry
    for (int64_t l = 0; l < c.num_layers; ++l)
      if (c.is_moe_layer(l)) ignore.push_back(module_prefix(l) + "gate");
  nlohmann::ordered_json q;
  q["config_groups"] = {{"group_0", group}};
  q["format"] = "pack-quantized";
  q["ignore"] = ignore;
  q["kv_cache_scheme"] = nullptr;
  q["quant_method"] = "compressed-tensors";
  q["quantization_status"] = "compressed";
  return q;
}

}  // namespace

std::string hf_config_json(const MoeConfig& c) {
  c.validate();
  nlohmann::ordered_json j;
  j["architectures"] = {architecture_for(c.model_type)};
  j["model_type"] = c.model_type;
  j["hidden_size"] = c.hidden;
  j["moe_intermediate_size"] = c.moe_intermediate;
  j["num_hidden_layers"] = c.num_layers;
  j["num_experts_per_tok"] = c.top_k;
  j["norm_topk_prob"] = c.norm_topk_prob;
  if (is_qwen(c.model_type)) {
    put_qwen(c, j);
  } else {
    put_deepseek(c, j);
  }
  if (c.int4) {
    j["quantization_config"] = int4_quantization_config(c);
  } else if (c.fp8) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {c.block_rows, c.block_cols}}};
  }
  j["torch_dtype"] = "bfloat16";
  return j.dump(2) + "\n";
}

}  // namespace moe
