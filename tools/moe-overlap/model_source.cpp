#include "model_source.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <stdexcept>

#include "io/checkpoint.h"
#include "io/io_error.h"
#include "io/mapped_file.h"
#include "kernels/linear.h"
#include "io/hf_config.h"
#include "layer/schedule.h"

namespace moe::tools {

namespace {

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{16} << 30;
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30); }

int64_t first_moe_layer(const MoeConfig& c) {
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (c.is_moe_layer(l)) return l;
  throw ConfigError("config has no MoE layer among its " + std::to_string(c.num_layers) + " layers");
}

class Progress {
 public:
  explicit Progress(std::string what) : what_(std::move(what)), start_(std::chrono::steady_clock::now()) {
    if (isatty(STDERR_FILENO)) std::fprintf(stderr, "%s ...", what_.c_str());
  }
  ~Progress() {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (isatty(STDERR_FILENO)) std::fprintf(stderr, " done (%.1f s)\n", s);
  }

 private:
  std::string what_;
  std::chrono::steady_clock::time_point start_;
};

// --reread: every *.safetensors file of the directory. Pages another process maps stay cached.
void drop_cached_checkpoint(const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    if (!MappedFile::drop_cached_pages(entry.path().string()))
      throw IoError("--reread: cannot drop the cached pages of '" + entry.path().string() + "': " +
                    std::strerror(errno));
  }
}

}  // namespace

void add_model_options(CLI::App* cmd, ModelOptions& o) {
  std::string names;
  for (const Preset& p : presets()) names += (names.empty() ? "" : ", ") + p.name;
  cmd->add_option("--model", o.model, "model directory (config.json + safetensors) or preset: " + names)
      ->capture_default_str();
  cmd->add_option("--layer", o.layer, "decoder layer index (default: the first MoE layer)");
  cmd->add_option("--experts", o.experts,
                  "keep experts [0, N) only (one expert-parallel rank's share; routing still covers all)");
  cmd->add_option("--dtype", o.dtype,
                  "preset weight dtype: bf16, f32, fp8 or int4 (routed experts int4 in groups of 32, the rest bf16; "
                  "default: the model's own)")
      ->check(CLI::IsMember({"auto", "bf16", "f32", "fp8", "int4"}))
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed of the preset's random weights and of the inputs")->capture_default_str();
  cmd->add_flag("--reread", o.reread,
                "checkpoints: drop the safetensors files' cached pages first, so that they are read from disk "
                "anew in 2 MiB pages (where the page cache holds them in 4 KiB ones; see bench's note)");
}

void add_tuning_option(CLI::App* cmd, ModelOptions& o) {
  cmd->add_option("--tuning", o.tuning, "tuning table for --schedule auto, as written by bench --tune");
}

void add_schedule_option(CLI::App* cmd, std::string& schedule) {
  std::vector<std::string> names;
  for (Schedule s : kRunnableSchedules) names.emplace_back(schedule_name(s));
  names.emplace_back(schedule_name(Schedule::kAuto));
  cmd->add_option("--schedule", schedule,
                  "serial, dual, phased, fused (the shared expert inside the routed expert ops), or auto (the "
                  "--tuning table's choice)")
      ->check(CLI::IsMember(names))
      ->capture_default_str();
}

void add_isa_option(CLI::App* cmd, ModelOptions& o) {
  cmd->add_option("--isa", o.isa,
                  "kernel instruction set: auto (best exact fp32 one), scalar, avx2, avx512, avx512bf16 "
                  "(vdpbf16ps: bf16/fp8/int4 expert weights against x rounded to bf16, up to 2x faster when "
                  "compute-bound), or avx2int8 (int4 expert weights against x quantized to int8 per 32 columns, "
                  "as llama.cpp's q8 activations; the avx2 kernels for other weights)")
      ->check(CLI::IsMember({"auto", "scalar", "avx2", "avx512", "avx512bf16", "avx2int8"}))
      ->capture_default_str();
}

Isa kernel_isa(const std::string& name) {
  if (name == "auto") return best_isa();
  const std::optional<Isa> isa = parse_isa(name);
  if (!isa) throw std::invalid_argument("--isa: expected auto, scalar, avx2, avx512, avx512bf16 or avx2int8, got '" + name + "'");
  if (!isa_supported(*isa))
    throw std::invalid_argument("--isa " + name + ": this CPU (or this build) does not support it; the best here is " +
                                std::string(isa_name(best_isa())));
  return *isa;
}

DType parse_dtype(const std::string& name) {
  if (name == "bf16") return DType::kBF16;
  if (name == "f32") return DType::kF32;
  if (name == "fp8") return DType::kF8E4M3;
  if (name == "int4") return DType::kInt4;
  throw std::invalid_argument("--dtype: expected bf16, f32, fp8 or int4, got '" + name + "'");
}

DType preset_dtype(const std::string& flag, const MoeConfig& config) {
  if (flag == "auto") return config.fp8 ? DType::kF8E4M3 : DType::kBF16;
  return parse_dtype(flag);
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (size_t comma; (comma = text.find(',', pos)) != std::string::npos; pos = comma + 1)
    out.push_back(text.substr(pos, comma - pos));
  out.push_back(text.substr(pos));
  return out;
}

std::vector<int64_t> parse_token_list(const std::string& text, const std::string& flag, int64_t max) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(text)) {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0 || v > max)
      throw std::invalid_argument(flag + ": expected comma-separated token counts in [0, " + std::to_string(max) +
                                  "], got '" + text + "'");
    out.push_back(v);
  }
  return out;
}

std::vector<float> random_activations(int64_t tokens, int64_t hidden, uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens * hidden));
  for (float& v : x) v = normal(rng);
  return x;
}

int64_t model_num_experts(const ModelOptions& o) {
  if (std::filesystem::is_directory(o.model)) return load_hf_config(o.model).num_experts;
  try {
    return find_preset(o.model).config.num_experts;
  } catch (const ConfigError& e) {
    throw std::invalid_argument("--model: '" + o.model + "' is neither a directory nor a preset; " + e.what());
  }
}

LoadedModel load_model(const ModelOptions& o) {
  LoadedModel m;
  const bool is_dir = std::filesystem::is_directory(o.model);
  if (is_dir) {
    if (o.dtype != "auto")
      throw std::invalid_argument("--dtype applies to presets only; a checkpoint's weights run as stored");
    if (o.reread) drop_cached_checkpoint(o.model);
    auto dir = std::make_shared<ModelDir>(o.model);
    m.config = dir->config();
    m.layer = o.layer < 0 ? first_moe_layer(m.config) : o.layer;
    {
      Progress p("mapping layer " + std::to_string(m.layer) + " of " + o.model);
      m.weights = load_layer(*dir, m.layer, o.experts, o.first_expert);
    }
    m.weights.storage.emplace_back(dir);
    m.dtype = m.weights.experts.empty() ? DType::kBF16 : m.weights.experts[0].gate.dtype;
    m.label = "checkpoint " + o.model + " (" + m.config.model_type + ")";
  } else {
    const Preset* preset = nullptr;
    try {
      preset = &find_preset(o.model);
    } catch (const ConfigError& e) {
      throw std::invalid_argument("--model: '" + o.model + "' is neither a directory nor a preset; " + e.what());
    }
    if (o.reread) throw std::invalid_argument("--reread applies to checkpoint directories; '" + o.model + "' is a preset");
    m.config = preset->config;
    m.layer = o.layer < 0 ? first_moe_layer(m.config) : o.layer;
    if (!m.config.is_moe_layer(m.layer))
      throw std::invalid_argument("--layer " + std::to_string(m.layer) + ": not an MoE layer of " + preset->name);
    m.dtype = preset_dtype(o.dtype, m.config);
    m.config.fp8 = m.dtype == DType::kF8E4M3;
    m.config.int4 = m.dtype == DType::kInt4;
    const int64_t local = o.experts < 0 ? m.config.num_experts - o.first_expert : o.experts;
    if (local < 1 || o.first_expert + local > m.config.num_experts)
      throw std::invalid_argument("--experts: expected 1.." + std::to_string(m.config.num_experts) + ", got " +
                                  std::to_string(o.experts));
    const int64_t bytes = m.config.layer_weight_bytes_of(local, m.dtype);
    if (bytes > physical_memory_bytes() / 2)
      throw std::invalid_argument(
          "the " + preset->name + " layer with " + std::to_string(local) + " experts needs " +
          std::to_string(gib(bytes)).substr(0, 5) + " GiB, more than half of this machine's memory: pass " +
          "--experts N (e.g. --experts 8, one expert-parallel rank's share)");
    {
      Progress p("generating " + preset->name + " weights (" + std::to_string(gib(bytes)).substr(0, 5) + " GiB)");
      m.weights = make_random_weights(
          m.config, {.dtype = m.dtype, .seed = o.seed, .num_local_experts = local, .first_expert = o.first_expert});
    }
    m.label = "preset " + preset->name + " (" + preset->description + ")";
  }
  if (m.weights.num_local_experts() < m.config.num_experts && o.first_expert == 0 && o.experts >= 0)
    m.notes.push_back("experts [0, " + std::to_string(m.weights.num_local_experts()) + ") of " +
                      std::to_string(m.config.num_experts) +
                      " kept: one expert-parallel rank's share; tokens routed elsewhere add nothing here");
  if (!m.config.has_shared_expert())
    m.notes.push_back(m.config.model_type + " has no shared expert: every schedule runs serial");
  return m;
}

}  // namespace moe::tools
