// Where a subcommand's layer comes from: a Hugging Face model directory (weights memory-mapped as stored) or
// a built-in preset (the real sizes of a published model, seeded random weights). Shared by every subcommand.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/linear.h"
#include "model/config.h"
#include "model/weights.h"

namespace moe::tools {

struct ModelOptions {
  std::string model = "qwen3-next-80b-a3b";
  int64_t layer = -1;    // -1: the first MoE layer
  int64_t experts = -1;  // -1: all; else keep experts [0, N) (one expert-parallel rank's share)
  int64_t first_expert = 0;  // expert parallelism: this rank's range starts here (set by the command, not a flag)
  std::string dtype = "auto";  // presets: bf16 | f32 | fp8 (auto: fp8 for fp8 presets, else bf16)
  uint64_t seed = 0;
  bool reread = false;  // drop the checkpoint's cached pages first, so they are read anew in 2 MiB pages
  std::string tuning;  // --tuning FILE: the table behind --schedule auto (bench --tune writes one)
  std::string isa = "auto";  // kernels: auto (the best exact one) | scalar | avx2 | avx512 | avx512bf16
};
void add_model_options(CLI::App* cmd, ModelOptions& options);
// --isa and --tuning, for the commands that run the layer (info only describes it).
void add_isa_option(CLI::App* cmd, ModelOptions& options);
void add_tuning_option(CLI::App* cmd, ModelOptions& options);
// --schedule (run, trace): a runnable schedule's name or "auto".
void add_schedule_option(CLI::App* cmd, std::string& schedule);
// The kernel ISA of --isa: best_isa() for "auto"; std::invalid_argument when unknown or not on this CPU.
Isa kernel_isa(const std::string& isa);

struct LoadedModel {
  MoeConfig config;
  LayerWeights weights;
  std::string label;               // "preset qwen3-next-80b-a3b (Qwen3-Next-80B-A3B)" or "checkpoint DIR"
  int64_t layer = 0;
  DType dtype = DType::kBF16;      // of the expert weights
  std::vector<std::string> notes;  // what the user should know (experts kept, memory)
};
// Loads or generates the layer; throws with one clear line on any problem. Prints progress on stderr when it
// takes a while (generating or mapping gigabytes).
LoadedModel load_model(const ModelOptions& options);
// The number of routed experts of --model, read without loading any weight (a checkpoint's config.json, or
// the preset's), so that an expert-parallel rank can compute its share first.
int64_t model_num_experts(const ModelOptions& options);

// Accepts bf16 | f32 | fp8.
DType parse_dtype(const std::string& name);
// The --dtype of a preset: "auto" is the model's own (fp8 for fp8 presets, else bf16), anything else parsed.
DType preset_dtype(const std::string& flag, const MoeConfig& config);

// "a,b,c" -> {"a", "b", "c"} (an empty item stays, so that the caller rejects it).
std::vector<std::string> split_list(const std::string& text);

// Parses "1,2,8" into token counts; throws naming `flag` on anything else (or a count outside [0, max]).
std::vector<int64_t> parse_token_list(const std::string& text, const std::string& flag, int64_t max);

// Seeded random activations [tokens, hidden], roughly unit RMS like a layer-normed hidden state.
std::vector<float> random_activations(int64_t tokens, int64_t hidden, uint64_t seed);

}  // namespace moe::tools
