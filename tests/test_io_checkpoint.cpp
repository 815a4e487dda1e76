// Checkpoint round trips: make_checkpoint writes a tiny model directory for each family (bf16, f32, fp8;
// per-expert and fused layouts; one or many shards); load_layer must give back exactly make_random_weights()
// of the same seed, as views into the mapped files. Broken directories fail naming the tensor and file.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/make_checkpoint.h"
#include "io/safetensors_writer.h"
#include "test_io_util.h"

namespace moe {
namespace {

using test::expect_error;
using test::ScratchDir;
namespace fs = std::filesystem;

MoeConfig tiny(const std::string& preset, int64_t h = 64, int64_t i = 32, int64_t e = 16, int64_t k = 4) {
  MoeConfig c = find_preset(preset).config;
  const int64_t n_shared = c.shared_intermediate / c.moe_intermediate;
  c.hidden = h;
  c.moe_intermediate = i;
  c.num_experts = e;
  c.top_k = k;
  c.num_layers = c.first_k_dense_replace + 2;
  if (c.has_shared_expert()) c.shared_intermediate = c.model_type.rfind("qwen", 0) == 0 ? 48 : std::max<int64_t>(n_shared, 1) * i;
  if (c.n_group > e / 2) c.n_group = c.topk_group = 1;
  return c;
}

void expect_view_equal(const WeightView& a, const WeightView& b, const std::string& what) {
  ASSERT_FALSE(a.empty()) << what;
  ASSERT_EQ(a.dtype, b.dtype) << what;
  ASSERT_EQ(a.rows, b.rows) << what;
  ASSERT_EQ(a.cols, b.cols) << what;
  EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.rows * a.cols) * dtype_size(a.dtype)), 0) << what;
  if (a.dtype == DType::kF8E4M3) {
    ASSERT_NE(a.scale_inv, nullptr) << what;
    const size_t nb = static_cast<size_t>(((a.rows + 127) / 128) * ((a.cols + 127) / 128));
    EXPECT_EQ(std::memcmp(a.scale_inv, b.scale_inv, nb * 4), 0) << what;
    // Both the loader and the generator classify the blocks once, and agree with a fresh classification.
    ASSERT_NE(a.fp8_codes, nullptr) << what;
    ASSERT_NE(b.fp8_codes, nullptr) << what;
    std::vector<uint8_t> codes(static_cast<size_t>(fp8_block_codes_size(a)));
    fp8_block_codes(a, codes.data());
    EXPECT_EQ(std::memcmp(a.fp8_codes, codes.data(), codes.size()), 0) << what;
    EXPECT_EQ(std::memcmp(b.fp8_codes, codes.data(), codes.size()), 0) << what;
  }
  // Spot-check through the scalar definition the kernels are tested against.
  EXPECT_EQ(weight_at(a, a.rows - 1, a.cols - 1), weight_at(b, b.rows - 1, b.cols - 1)) << what;
}

void expect_layer_equal(const LayerWeights& got, const LayerWeights& want, const MoeConfig& c, const std::string& what) {
  expect_view_equal(got.router, want.router, what + " router");
  if (c.correction_bias) {
    ASSERT_NE(got.correction_bias, nullptr);
    EXPECT_EQ(std::memcmp(got.correction_bias, want.correction_bias, static_cast<size_t>(c.num_experts) * 4), 0) << what;
  }
  ASSERT_EQ(got.experts.size(), want.experts.size()) << what;
  for (size_t e = 0; e < got.experts.size(); ++e) {
    const std::string x = what + " expert " + std::to_string(e);
    expect_view_equal(got.experts[e].gate, want.experts[e].gate, x + " gate");
    expect_view_equal(got.experts[e].up, want.experts[e].up, x + " up");
    expect_view_equal(got.experts[e].down, want.experts[e].down, x + " down");
  }
  if (c.has_shared_expert()) {
    expect_view_equal(got.shared.gate, want.shared.gate, what + " shared gate");
    expect_view_equal(got.shared.up, want.shared.up, what + " shared up");
    expect_view_equal(got.shared.down, want.shared.down, what + " shared down");
  }
  if (c.shared_expert_gate) expect_view_equal(got.shared_gate, want.shared_gate, what + " shared_expert_gate");
}

void round_trip(const MoeConfig& c, const CheckpointOptions& o, int64_t n_local = -1) {
  ScratchDir dir;
  write_checkpoint(dir.path(), c, o);
  ModelDir md(dir.path());
  MoeConfig want_cfg = c;
  want_cfg.fp8 = o.dtype == DType::kF8E4M3;
  EXPECT_EQ(md.config().num_experts, c.num_experts);
  EXPECT_EQ(md.config().fp8, want_cfg.fp8);
  int64_t layer = o.layers.empty() ? -1 : o.layers.front();
  for (int64_t l = 0; layer < 0; ++l)
    if (c.is_moe_layer(l)) layer = l;
  const LayerWeights got = load_layer(md, layer, n_local);
  RandomWeightOptions r;
  r.dtype = o.dtype;
  r.seed = o.seed;
  r.num_local_experts = n_local;
  const LayerWeights want = make_random_weights(c, r);
  expect_layer_equal(got, want, c, c.model_type + " layer " + std::to_string(layer));
}

TEST(Checkpoint, EveryFamilyRoundTripsBf16) {
  for (const Preset& p : presets()) {
    CheckpointOptions o;
    o.seed = 11;
    round_trip(tiny(p.name), o);
  }
  MoeConfig v2 = tiny("deepseek-v2-lite");
  v2.topk_method = TopkMethod::kGroupLimitedGreedy;
  v2.n_group = 4;
  v2.topk_group = 2;
  round_trip(v2, {});
  MoeConfig v32 = tiny("deepseek-v3");
  v32.model_type = "deepseek_v32";
  round_trip(v32, {});
}

TEST(Checkpoint, F32AndFp8WithBlockScales) {
  CheckpointOptions f32;
  f32.dtype = DType::kF32;
  f32.seed = 3;
  round_trip(tiny("qwen3-next-80b-a3b"), f32);
  CheckpointOptions fp8;
  fp8.dtype = DType::kF8E4M3;
  fp8.seed = 5;
  // Partial 128-blocks in both directions: gate [160, 256] -> scales [2, 2], down [256, 160] -> [2, 2].
  round_trip(tiny("deepseek-v3", 256, 160, 16, 4), fp8);
  round_trip(tiny("kimi-k2", 256, 160, 8, 2), fp8);
}

TEST(Checkpoint, FusedLayoutShardsAndChunks) {
  for (DType t : {DType::kBF16, DType::kF32}) {
    CheckpointOptions o;
    o.dtype = t;
    o.fused_experts = true;
    o.chunk_bytes = 1;  // one expert per chunk: exercises both passes over the experts
    o.seed = 9;
    round_trip(tiny("qwen3-next-80b-a3b"), o);
    round_trip(tiny("glm-4.5-air"), o, 5);
  }
  CheckpointOptions o;
  o.shard_bytes = 20'000;
  o.chunk_bytes = 30'000;
  o.seed = 2;
  round_trip(tiny("deepseek-v3"), o, 7);
  ScratchDir dir;
  write_checkpoint(dir.path(), tiny("deepseek-v3"), o);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  int shards = 0;
  for (const auto& f : fs::directory_iterator(dir.path())) shards += f.path().filename().string().rfind("model-000", 0) == 0;
  EXPECT_GE(shards, 2);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
}

TEST(Checkpoint, LoadedWeightsAreViewsIntoTheMapping) {
  ScratchDir dir;
  const MoeConfig c = tiny("qwen3-next-80b-a3b");
  write_checkpoint(dir.path(), c, {});
  ModelDir md(dir.path());
  const LayerWeights w = load_layer(md, 0);
  auto f = md.tensors().get("model.layers.0.mlp.experts.3.down_proj.weight");
  EXPECT_EQ(w.experts[3].down.data, f.data);
  bool holds_mapping = false;
  for (const auto& s : w.storage) holds_mapping |= s.type() == typeid(std::shared_ptr<const SafetensorsFile>);
  EXPECT_TRUE(holds_mapping);
}

TEST(Checkpoint, SeveralLayersAndLayerErrors) {
  ScratchDir dir;
  MoeConfig c = tiny("deepseek-v2-lite");  // layer 0 dense
  c.num_layers = 4;
  CheckpointOptions o;
  o.layers = {1, 3};
  write_checkpoint(dir.path(), c, o);
  ModelDir md(dir.path());
  EXPECT_EQ(load_layer(md, 3).num_local_experts(), c.num_experts);
  expect_error([&] { load_layer(md, 0); }, {"layer 0", "dense"});
  expect_error([&] { load_layer(md, 4); }, {"layer 4", "out of range"});
  expect_error([&] { load_layer(md, 2); }, {"model.layers.2.mlp.gate.weight", "[16, 64]", "model.safetensors"});
  expect_error([&] { load_layer(md, 1, 17); }, {"experts [0, 17)", "do not fit"});
  o.layers = {0};
  expect_error([&] { write_checkpoint(dir / "x", c, o); }, {"layer 0", "not an MoE layer"});
  CheckpointOptions fused;
  fused.dtype = DType::kF8E4M3;
  fused.fused_experts = true;
  expect_error([&] { write_checkpoint(dir / "y", c, fused); }, {"fused", "fp8"});
  EXPECT_FALSE(fs::exists(dir / "x"));  // an invalid request creates nothing
  EXPECT_FALSE(fs::exists(dir / "y"));
}

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Whether `dir` loads as a checkpoint whose layer equals make_random_weights() of `seed`.
void expect_loads(const std::string& dir, const MoeConfig& c, uint64_t seed, const std::string& what) {
  ModelDir md(dir);
  const int64_t layer = c.first_k_dense_replace;
  RandomWeightOptions r;
  r.seed = seed;
  expect_layer_equal(load_layer(md, layer), make_random_weights(c, r), c, what);
}

// A checkpoint written over another replaces it as a whole (no stale shard or index of the old one is
// left); files that are not a checkpoint's stay.
TEST(Checkpoint, WritingOverACheckpointReplacesItWhole) {
  ScratchDir dir;
  const MoeConfig c = tiny("qwen1.5-moe-a2.7b");
  test::write_bytes(dir / "notes.txt", "mine");
  CheckpointOptions sharded;
  sharded.shard_bytes = 40'000;
  sharded.seed = 1;
  write_checkpoint(dir.path(), c, sharded);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  expect_loads(dir.path(), c, 1, "sharded");
  CheckpointOptions single;
  single.seed = 2;
  write_checkpoint(dir.path(), c, single);
  EXPECT_EQ(listing(dir.path()), (std::vector<std::string>{"config.json", "model.safetensors", "notes.txt"}));
  expect_loads(dir.path(), c, 2, "single over sharded");
  sharded.seed = 3;
  write_checkpoint(dir.path(), c, sharded);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  expect_loads(dir.path(), c, 3, "sharded over single");
  for (const std::string& n : listing(dir.path()))
    EXPECT_TRUE(n == "config.json" || n == "notes.txt" || n == "model.safetensors.index.json" ||
                (n.rfind("model-000", 0) == 0 && n.size() > 12 && n.substr(n.size() - 12) == ".safetensors"))
        << n;
}

// What a killed write leaves (staged files, and the temporaries of the writer before staging) never loads,
// and the next write into the directory removes it; other files stay.
TEST(Checkpoint, LeftoversOfAKilledWriteAreRemovedByTheNext) {
  ScratchDir dir;
  const MoeConfig c = tiny("qwen3-next-80b-a3b");
  const std::vector<std::string> leftovers = {
      "config.json.partial", "model.safetensors.partial", "model-00001-of-00003.safetensors.partial.tmp.4242",
      "model.safetensors.index.json.partial", "config.json.tmp", "model.safetensors.tmp.77"};
  const std::vector<std::string> others = {"config.json.partial.bak", "notes.partial", "model.safetensors.tmp.x"};
  for (const auto& n : leftovers) test::write_bytes(dir / n, "{}");
  for (const auto& n : others) test::write_bytes(dir / n, "{}");
  expect_error([&] { ModelDir m(dir.path()); }, {"config.json", "cannot open"});
  write_checkpoint(dir.path(), c, {});
  for (const auto& n : leftovers) EXPECT_FALSE(fs::exists(dir / n)) << n;
  for (const auto& n : others) EXPECT_TRUE(fs::exists(dir / n)) << n;
  expect_loads(dir.path(), c, 0, "after leftovers");
}

// A final name that cannot be replaced (a directory) fails before anything changes: the checkpoint there
// still loads, unchanged, and no staged file is left.
TEST(Checkpoint, AFailureBeforeTheCommitChangesNothing) {
  ScratchDir dir;
  const MoeConfig c = tiny("qwen1.5-moe-a2.7b");
  CheckpointOptions o;
  o.seed = 4;
  write_checkpoint(dir.path(), c, o);
  fs::create_directories(dir / "model-00002-of-00003.safetensors/x");
  const std::vector<std::string> before = listing(dir.path());
  CheckpointOptions fused;
  fused.fused_experts = true;
  fused.shard_bytes = 40'000;  // router + shared expert, gate_up_proj, down_proj
  fused.seed = 5;
  expect_error([&] { write_checkpoint(dir.path(), c, fused); },
               {dir / "model-00002-of-00003.safetensors", "is a directory"});
  EXPECT_EQ(listing(dir.path()), before);
  expect_loads(dir.path(), c, 4, "after the failed write");
}

// Runs `f` in a child process whose files may not pass `limit` bytes (RLIMIT_FSIZE). With `ignore_signal`
// a write past the limit fails with EFBIG (as on a full disk); without it SIGXFSZ kills the child half way.
// Returns the child's wait status; f's return value is its exit code.
int run_with_file_size_limit(uint64_t limit, bool ignore_signal, const std::function<int()>& f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (ignore_signal) ::signal(SIGXFSZ, SIG_IGN);
    const rlimit r{limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &r);
    int code = 99;
    try {
      code = f();
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// The fused tiny checkpoint in three shards (about 20 KiB, 128 KiB, 64 KiB): with files limited to 50 000
// bytes the first shard is written whole and the second fails half way.
CheckpointOptions three_shards(uint64_t seed) {
  CheckpointOptions o;
  o.fused_experts = true;
  o.shard_bytes = 40'000;
  o.seed = seed;
  return o;
}

TEST(Checkpoint, AWriteFailingHalfWayLeavesNothing) {
  ScratchDir root;
  const MoeConfig c = tiny("qwen1.5-moe-a2.7b");
  const std::string fresh = root / "new/model";
  // A new directory (and its new parent) is removed again; the error names the file and the cause.
  int st = run_with_file_size_limit(50'000, true, [&] {
    try {
      write_checkpoint(fresh, c, three_shards(1));
    } catch (const IoError& e) {
      const std::string m = e.what();
      return m.find(fresh + "/model-00002-of-00003.safetensors") != std::string::npos &&
                     m.find("File too large") != std::string::npos
                 ? 0
                 : 2;
    }
    return 1;
  });
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "1: no error, 2: an error that does not name the shard and EFBIG";
  EXPECT_FALSE(fs::exists(root / "new"));
  // A checkpoint that was there stays as it was.
  const std::string kept = root / "kept";
  write_checkpoint(kept, c, three_shards(1));
  const std::vector<std::string> before = listing(kept);
  st = run_with_file_size_limit(50'000, true, [&] {
    write_checkpoint(kept, c, three_shards(2));
    return 1;
  });
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 99);  // it threw
  EXPECT_EQ(listing(kept), before);
  expect_loads(kept, c, 1, "after the failed write");
}

TEST(Checkpoint, AWriteKilledHalfWayLeavesNothingThatLoads) {
  ScratchDir root;
  const MoeConfig c = tiny("qwen1.5-moe-a2.7b");
  const std::string fresh = root / "model";
  int st = run_with_file_size_limit(50'000, false, [&] {
    write_checkpoint(fresh, c, three_shards(1));
    return 1;
  });
  ASSERT_TRUE(WIFSIGNALED(st)) << st;
  EXPECT_EQ(WTERMSIG(st), SIGXFSZ);
  ASSERT_TRUE(fs::is_directory(fresh));
  EXPECT_FALSE(fs::exists(fresh + "/config.json"));
  expect_error([&] { ModelDir m(fresh); }, {"config.json"});
  // Over a checkpoint: the old one still loads.
  write_checkpoint(fresh, c, three_shards(1));
  st = run_with_file_size_limit(50'000, false, [&] {
    write_checkpoint(fresh, c, three_shards(2));
    return 1;
  });
  ASSERT_TRUE(WIFSIGNALED(st)) << st;
  expect_loads(fresh, c, 1, "after the killed write");
  // The next complete write leaves exactly the checkpoint.
  write_checkpoint(fresh, c, three_shards(2));
  EXPECT_EQ(listing(fresh), (std::vector<std::string>{"config.json", "model-00001-of-00003.safetensors",
                                                     "model-00002-of-00003.safetensors",
                                                     "model-00003-of-00003.safetensors",
                                                     "model.safetensors.index.json"}));
  expect_loads(fresh, c, 2, "after the rewrite");
}

// Rewrites one safetensors file of `dir` through `edit` (which may drop, rename or reshape tensors).
void rewrite(const std::string& path, const std::function<bool(TensorSpec&, std::string&)>& edit) {
  std::vector<std::pair<TensorSpec, std::string>> items;
  {
    auto f = SafetensorsFile::open(path);
    for (const auto& t : f->header().tensors) {
      TensorSpec s{t.name, t.dtype, t.shape};
      std::string bytes(static_cast<const char*>(f->data(t)), t.bytes());
      if (edit(s, bytes)) items.emplace_back(s, bytes);
    }
  }
  std::vector<TensorData> data;
  for (const auto& [s, b] : items) data.push_back({s, b.data()});
  write_safetensors(path, data);
}

TEST(Checkpoint, BrokenDirectoriesNameTensorAndFile) {
  ScratchDir root;
  const MoeConfig c = tiny("qwen1.5-moe-a2.7b");
  const std::string p = "model.layers.0.mlp.";
  int n = 0;
  // A fresh sharded checkpoint per case, and the shard that holds `name`.
  auto fresh = [&](const std::string& name, std::string* shard) {
    const std::string d = root / ("case" + std::to_string(n++));
    CheckpointOptions o;
    o.shard_bytes = 40'000;
    write_checkpoint(d, c, o);
    *shard = TensorStore(d).get(name).file->path();
    return d;
  };
  std::string shard;
  std::string d = fresh(p + "experts.3.up_proj.weight", &shard);
  rewrite(shard, [&](TensorSpec& s, std::string&) { return s.name != p + "experts.3.up_proj.weight"; });
  expect_error([&] { load_layer(d, c, 0); }, {p + "experts.3.up_proj.weight", "does not hold it", shard, "index.json"});

  d = fresh(p + "experts.5.gate_proj.weight", &shard);
  rewrite(shard, [&](TensorSpec& s, std::string& b) {
    if (s.name == p + "experts.5.gate_proj.weight") {
      s.shape = {16, 64};
      b.resize(16 * 64 * 2);
    }
    return true;
  });
  expect_error([&] { load_layer(d, c, 0, 6); }, {p + "experts.5.gate_proj.weight", shard, "[16, 64]", "expected [32, 64]"});

  d = fresh(p + "gate.weight", &shard);
  rewrite(shard, [&](TensorSpec& s, std::string&) {
    if (s.name == p + "gate.weight") s.dtype = StDType::kI16;
    return true;
  });
  expect_error([&] { load_layer(d, c, 0, 1); }, {p + "gate.weight", "I16", "F32 or BF16"});

  d = fresh(p + "shared_expert.down_proj.weight", &shard);
  fs::remove(shard);
  expect_error([&] { load_layer(d, c, 0, 1); }, {shard, "does not exist", "index.json"});

  d = fresh(p + "gate.weight", &shard);
  test::write_bytes(d + "/model.safetensors.index.json", "{\"weight_map\": {}}");
  expect_error([&] { load_layer(d, c, 0, 1); }, {p + "gate.weight", "not found", "index.json"});
  fs::remove(d + "/model.safetensors.index.json");
  expect_error([&] { load_layer(d, c, 0, 1); }, {d, "neither"});
  fs::remove(d + "/config.json");
  expect_error([&] { ModelDir m(d); }, {"config.json", "cannot open"});
}

TEST(Checkpoint, Bf16BiasIsConvertedAndFp8NeedsScales) {
  ScratchDir dir;
  const MoeConfig c = tiny("glm-4.5-air");
  write_checkpoint(dir.path(), c, {});
  const std::string file = dir / "model.safetensors";
  const std::string bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  rewrite(file, [&](TensorSpec& s, std::string& b) {
    if (s.name == bias) {
      std::string h(b.size() / 2, '\0');
      for (size_t e = 0; e < b.size() / 4; ++e) {
        float v;
        std::memcpy(&v, b.data() + 4 * e, 4);
        const uint16_t x = f32_to_bf16(v);
        std::memcpy(h.data() + 2 * e, &x, 2);
      }
      b = h;
      s.dtype = StDType::kBF16;
    }
    return true;
  });
  const LayerWeights w = load_layer(dir.path(), c, 1, 1);
  const LayerWeights want = make_random_weights(c, {});
  for (int64_t e = 0; e < c.num_experts; ++e)
    EXPECT_EQ(w.correction_bias[e], bf16_to_f32(f32_to_bf16(want.correction_bias[e])));

  ScratchDir d8;
  CheckpointOptions o;
  o.dtype = DType::kF8E4M3;
  write_checkpoint(d8.path(), c, o);
  rewrite(d8 / "model.safetensors",
          [&](TensorSpec& s, std::string&) { return s.name != "model.layers.1.mlp.experts.0.down_proj.weight_scale_inv"; });
  expect_error([&] { load_layer(d8.path(), c, 1, 1); },
               {"model.layers.1.mlp.experts.0.down_proj.weight_scale_inv", "[1, 1]", "not found"});
}

}  // namespace
}  // namespace moe
