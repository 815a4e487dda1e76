// `moe-overlap check`: every schedule against serial (bitwise) and serial against the fp64 reference, for a
// model, a preset, or every family at small sizes (--tiny); optionally under the stream sanitizer and the
// schedule fuzzer. Exits non-zero when anything differs.
//
// Tokens whose fp64 routing is a near tie may legitimately route differently in fp32 and are not compared
// with the reference; a run in which more than --max-skipped-share of the tokens were skipped fails, since
// its reference comparison checked little or nothing (a router whose scores all but tie, for instance).
#include <cmath>
#include <cstdio>
#include <cstring>

#include "commands.h"
#include "kernels/linear.h"
#include "layer/moe_layer.h"
#include "check/reference.h"
#include "check/tiny_configs.h"
#include "model_source.h"
#include "runtime/sanitizer.h"
#include "runtime/schedule_fuzz.h"

namespace moe::tools {

namespace {

struct CheckOptions {
  ModelOptions model;
  std::string tokens = "1,3,16,64";
  int threads = 0;
  bool tiny = false, sanitize = false, fuzz = false, graph = false;
  double max_skipped_share = 0.25;  // of all tokens of the run, skipped as near ties
};

// fp32 arithmetic against fp64 on the same weight values: the error grows with the reduction length. Where
// the kernels approximate x before the expert matrices: 1e-2 where it is rounded to bf16 (avx512bf16, 2^-9
// per product), 3e-2 where it is quantized to int8 (avx2int8 on int4 weights, up to 2^-8 of each 32 columns'
// max |x|; the layer tests measured up to 1.25e-2 at real sizes).
double tolerance(Isa isa, const MoeConfig& c, const LayerWeights& w) {
  if (!w.experts.empty() && quantizes_x_to_int8(isa, w.experts[0].gate.dtype)) return 3e-2;
  if (!w.experts.empty() && rounds_x_to_bf16(isa, w.experts[0].gate.dtype)) return 1e-2;
  return 1e-5 * std::max(1.0, std::sqrt(static_cast<double>(c.hidden) / 256.0));
}

// Bitwise equality (NaN payloads and signed zeros included); safe for empty outputs (0 tokens).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// One forward, eager or (graph) captured and replayed twice: the second replay must not depend on the first.
std::vector<float> forward(Isa isa, rt::Device& dev, const MoeConfig& c, const LayerWeights& w,
                           const std::vector<float>& x, int64_t tokens, Schedule s, bool graph = false) {
  MoeLayer layer(c, w, dev, {.max_tokens = std::max<int64_t>(tokens, 1), .policy = OverlapPolicy::always(), .isa = isa});
  std::vector<float> y(static_cast<size_t>(tokens * c.hidden));
  if (graph) {
    const LayerGraph g = layer.capture(x.data(), tokens, y.data(), {.schedule = s});
    for (int i = 0; i < 2; ++i) layer.replay(g, x.data(), tokens, y.data());
  } else {
    layer.forward(x.data(), tokens, y.data(), {.schedule = s, .check_input = true});
  }
  rt::current_stream(dev).synchronize();
  return y;
}

class Checker {
 public:
  explicit Checker(const CheckOptions& o) : o_(o), isa_(kernel_isa(o.model.isa)) {}

  void check_model(const std::string& name, const MoeConfig& c, const LayerWeights& w) {
    for (int64_t t : parse_token_list(o_.tokens, "--tokens", 1 << 16)) check_tokens(name, c, w, t);
  }
  int failures() const { return failures_; }
  int checks() const { return checks_; }

  // Fails when more than --max-skipped-share of the tokens compared with the reference were skipped as near
  // ties (as tests/test_layer.cpp bounds its skips): past it the comparison checked too little to pass.
  void check_skipped_share() {
    if (reference_tokens_ == 0) return;
    const double share = static_cast<double>(skipped_) / static_cast<double>(reference_tokens_);
    char buf[400];
    if (share <= o_.max_skipped_share) {
      std::snprintf(buf, sizeof buf, "fp64 reference: %lld of %lld tokens skipped as near ties (%.0f%%; "
                    "--max-skipped-share %g)", static_cast<long long>(skipped_),
                    static_cast<long long>(reference_tokens_), 100 * share, o_.max_skipped_share);
    } else {
      std::snprintf(buf, sizeof buf, "fp64 reference: %lld of %lld tokens skipped as near ties (%.0f%%), more "
                    "than --max-skipped-share %g allows: the reference comparison checked too little (does the "
                    "router give nearly equal scores to many experts?)", static_cast<long long>(skipped_),
                    static_cast<long long>(reference_tokens_), 100 * share, o_.max_skipped_share);
    }
    report(share <= o_.max_skipped_share, buf);
  }

 private:
  void report(bool ok, const std::string& what) {
    ++checks_;
    failures_ += ok ? 0 : 1;
    std::printf("%s  %s\n", ok ? "PASS" : "FAIL", what.c_str());
    std::fflush(stdout);
  }

  void check_tokens(const std::string& name, const MoeConfig& c, const LayerWeights& w, int64_t t) {
    const std::string at = name + " tokens=" + std::to_string(t);
    const std::vector<float> x = random_activations(t, c.hidden, o_.model.seed + static_cast<uint64_t>(t));
    auto dev = rt::make_cpu_device({.num_workers = o_.threads});
    const std::vector<float> serial = forward(isa_, *dev, c, w, x, t, Schedule::kSerial);
    check_reference(at, c, w, x, t, serial);
    for (Schedule s : kRunnableSchedules) {
      if (s == Schedule::kSerial) continue;
      const std::vector<float> y = forward(isa_, *dev, c, w, x, t, s);
      report(same_bits(y, serial),
             at + " " + std::string(schedule_name(s)) + " bitwise == serial");
    }
    if (o_.graph)
      for (Schedule s : kRunnableSchedules) {
        const std::vector<float> y = forward(isa_, *dev, c, w, x, t, s, /*graph=*/true);
        report(same_bits(y, serial),
               at + " " + std::string(schedule_name(s)) + " graph replay bitwise == eager serial");
      }
    if (o_.sanitize) {
      auto sdev = rt::make_cpu_device({.num_workers = o_.threads});
      auto san = rt::enable_sanitizer(*sdev, {.throw_on_first = false});
      for (Schedule s : kRunnableSchedules) {
        forward(isa_, *sdev, c, w, x, t, s);
        if (o_.graph) forward(isa_, *sdev, c, w, x, t, s, /*graph=*/true);
        const auto reports = san->take_reports();
        report(reports.empty(), at + " " + std::string(schedule_name(s)) + " sanitizer: " +
                                    (reports.empty() ? "no hazard" : reports.front().message));
      }
    }
    if (o_.fuzz) {
      for (Schedule s : kRunnableSchedules) {
        rt::FuzzConfig fc;
        fc.num_workers = o_.threads > 0 ? o_.threads : 2;
        fc.seed = o_.model.seed + 1;
        const rt::FuzzOutcome out = rt::run_fuzzed(
            [&](rt::Device& d) {
              const std::vector<float> y = forward(isa_, d, c, w, x, t, s, o_.graph);
              if (!same_bits(y, serial))
                throw std::runtime_error("output differs from the unfuzzed serial run");
              return rt::bytes_of(y);
            },
            fc);
        report(out.ok(), at + " " + std::string(schedule_name(s)) + " fuzzed (" + std::to_string(out.num_runs) +
                             " runs)" + (out.ok() ? "" : ": " + out.summary()));
      }
    }
  }

  void check_reference(const std::string& at, const MoeConfig& c, const LayerWeights& w, const std::vector<float>& x,
                       int64_t t, const std::vector<float>& y) {
    std::vector<ReferenceRoute> routes;
    const std::vector<double> ref = reference_forward(c, w, x.data(), t, &routes);
    double worst = 0;
    int64_t skipped = 0;
    for (int64_t i = 0; i < t; ++i) {
      const ReferenceRoute& r = routes[static_cast<size_t>(i)];
      if (r.margin > 0 && r.margin < 1e-5) {  // a near-tie may route differently in fp32: not a bug
        ++skipped;
        continue;
      }
      double scale = 1e-30, err = 0;
      for (int64_t j = 0; j < c.hidden; ++j) {
        const size_t k = static_cast<size_t>(i * c.hidden + j);
        scale = std::max(scale, std::fabs(ref[k]));
        err = std::max(err, std::fabs(static_cast<double>(y[k]) - ref[k]));
      }
      worst = std::max(worst, err / scale);
    }
    skipped_ += skipped;
    reference_tokens_ += t;
    char buf[160];
    if (t > 0 && skipped == t) {
      std::snprintf(buf, sizeof buf,
                    " serial vs fp64 reference: nothing compared (every one of the %lld tokens skipped as a near tie)",
                    static_cast<long long>(t));
    } else {
      const std::string note = skipped ? ", " + std::to_string(skipped) + " near-tie tokens skipped" : "";
      std::snprintf(buf, sizeof buf, " serial vs fp64 reference: max error %.2e of max |y| (tolerance %.1e)%s", worst,
                    tolerance(isa_, c, w), note.c_str());
    }
    report(worst <= tolerance(isa_, c, w), at + buf);
  }

  const CheckOptions& o_;
  const Isa isa_;
  int failures_ = 0, checks_ = 0;
  int64_t skipped_ = 0, reference_tokens_ = 0;  // over the whole run
};

void run_check(const CheckOptions& o) {
  Checker checker(o);
  if (o.tiny) {
    for (const TinyConfig& tc : tiny_configs())
      for (DType d : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
        MoeConfig c = tc.config;
        c.fp8 = d == DType::kF8E4M3;
        const LayerWeights w = make_random_weights(c, {.dtype = d, .seed = o.model.seed});
        checker.check_model(tc.name + " " + std::string(dtype_name(d)), c, w);
      }
    for (const TinyConfig& tc : tiny_int4_configs()) {  // int4 needs widths of whole groups
      const LayerWeights w = make_random_weights(tc.config, {.dtype = DType::kInt4, .seed = o.model.seed});
      checker.check_model(tc.name, tc.config, w);
    }
  } else {
    const LoadedModel m = load_model(o.model);
    for (const std::string& n : m.notes) std::printf("note: %s\n", n.c_str());
    checker.check_model(m.label + " layer " + std::to_string(m.layer), m.config, m.weights);
  }
  checker.check_skipped_share();
  std::printf("%d checks, %d passed, %d failed\n", checker.checks(), checker.checks() - checker.failures(),
              checker.failures());
  if (checker.failures() > 0) throw std::runtime_error(std::to_string(checker.failures()) + " checks failed");
}

}  // namespace

void add_check_command(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* cmd = app.add_subcommand("check", "every schedule vs serial (bitwise) and vs the fp64 reference");
  add_model_options(cmd, o->model);
  add_isa_option(cmd, o->model);
  cmd->add_option("--tokens", o->tokens, "token counts to check")->capture_default_str();
  cmd->add_option("--threads", o->threads, "worker threads (default: one per core)");
  cmd->add_option("--max-skipped-share", o->max_skipped_share,
                  "fail when more than this share of the tokens is skipped as near ties in the fp64 reference "
                  "comparison (a near tie may route differently in fp32); 1 never fails")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--tiny", o->tiny, "every family and routing variant at small sizes, f32/bf16/fp8 (ignores --model)");
  cmd->add_flag("--graph", o->graph, "also capture each schedule as a graph and replay it (and fuzz/sanitize replays)");
  cmd->add_flag("--sanitize", o->sanitize, "also run under the stream sanitizer (vector clocks over byte ranges)");
  cmd->add_flag("--fuzz", o->fuzz, "also run under schedule fuzzing (delays, serialized streams, shuffled tiles, NaN-poisoned scratch)");
  cmd->callback([o] { run_check(*o); });
}

}  // namespace moe::tools
