// The declaration check: an operation that writes outside its declared ranges is caught (one element past the
// end of a guarded buffer, a row past a declared sub-range, a range declared read-only), so is one that reads
// past its declared reads, and correct ones pass.
#include "runtime/declaration_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/graph.h"
#include "runtime/sanitizer.h"
#include "test_sanitizer_program.h"

namespace moe::rt {
namespace {

struct DeclarationTest : ::testing::Test {
  std::unique_ptr<Device> dev = make_cpu_device({.num_workers = 1});
  std::shared_ptr<DeclarationChecker> chk = enable_declaration_check(*dev);
  Stream main = dev->default_stream();
};

void expect_violation(Stream& s, const std::string& op, const std::string& buffer) {
  try {
    s.synchronize();
    ADD_FAILURE() << "no error from op '" << op << "'";
  } catch (const StreamError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("declaration check: op '" + op + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("'" + buffer), std::string::npos) << what;
  }
}

TEST_F(DeclarationTest, OneElementPastTheDeclaredEnd) {
  constexpr int n = 32;
  auto* buf = static_cast<float*>(chk->allocate_guarded(n * sizeof(float), "scratch"));
  main.launch({.name = "off_by_one", .num_tiles = 4, .tile = [buf](int t) {
                 for (int i = t * 8; i < t * 8 + 8; ++i) buf[i] = 1.0f;
                 if (t == 3) buf[n] = 1.0f;  // one past the end: the guard zone
               },
               .accesses = {writes(buf, n * sizeof(float))}});
  expect_violation(main, "off_by_one", "scratch");
  ASSERT_EQ(chk->violations().size(), 1u);
  EXPECT_NE(chk->violations()[0].find("byte " + std::to_string(DeclarationChecker::kGuardBytes + n * sizeof(float))),
            std::string::npos)
      << chk->violations()[0];
  EXPECT_THROW(chk->verify_guards(), DeclarationError);
}

TEST_F(DeclarationTest, ARowPastADeclaredSubRange) {
  std::vector<float> buf(8 * 16);
  dev->notify_alloc(buf.data(), buf.size() * sizeof(float));  // announced buffers are registered
  float* p = buf.data();
  main.launch({.name = "rows_0_to_3", .num_tiles = 5, .tile = [p](int r) {
                 for (int j = 0; j < 16; ++j) p[r * 16 + j] = 2.0f;  // tile 4 writes row 4: undeclared
               },
               .accesses = {writes(p, 4 * 16 * sizeof(float))}});
  expect_violation(main, "rows_0_to_3", "notified allocation");
  // The first changed byte of row 4 (bytes [256, 320)): 2.0f is 00 00 00 40 in little-endian order.
  EXPECT_NE(chk->violations().at(0).find("wrote byte 259 "), std::string::npos) << chk->violations()[0];
}

TEST_F(DeclarationTest, WriteToARangeDeclaredRead) {
  auto* in = static_cast<float*>(chk->allocate_guarded(64, "input"));
  auto* out = static_cast<float*>(chk->allocate_guarded(64, "output"));
  main.launch({.name = "in_place_by_mistake", .num_tiles = 1, .tile = [in, out](int) {
                 for (int i = 0; i < 16; ++i) out[i] = in[i] = in[i] + 1.0f;
               },
               .accesses = {reads(in, 64), writes(out, 64)}});
  expect_violation(main, "in_place_by_mistake", "input");
}

// A planted undeclared read: the op declares the first half of its input and reads one element past it.
TEST_F(DeclarationTest, AReadPastTheDeclaredRangeIsCaught) {
  constexpr int n = 16;
  auto* in = static_cast<float*>(chk->allocate_guarded(2 * n * sizeof(float), "input"));
  auto* out = static_cast<float*>(chk->allocate_guarded(n * sizeof(float), "output"));
  for (int i = 0; i < 2 * n; ++i) in[i] = static_cast<float>(i) + 0.5f;
  main.launch({.name = "reads_one_more", .num_tiles = 2, .tile = [in, out](int t) {
                 for (int i = t * 8; i < t * 8 + 8; ++i) out[i] = in[i] + (i == n - 1 ? in[n] : 0.0f);
               },
               .accesses = {reads(in, n * sizeof(float)), writes(out, n * sizeof(float))}});
  try {
    main.synchronize();
    ADD_FAILURE() << "the undeclared read was not caught";
  } catch (const StreamError& e) {
    EXPECT_NE(std::string(e.what()).find("op 'reads_one_more'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("did not declare"), std::string::npos) << e.what();
  }
  // The same op with the read declared passes and computes the real result.
  main.launch({.name = "reads_declared", .num_tiles = 2, .tile = [in, out](int t) {
                 for (int i = t * 8; i < t * 8 + 8; ++i) out[i] = in[i] + (i == n - 1 ? in[n] : 0.0f);
               },
               .accesses = {reads(in, (n + 1) * sizeof(float)), writes(out, n * sizeof(float))}});
  EXPECT_NO_THROW(main.synchronize());
  EXPECT_EQ(out[n - 1], in[n - 1] + in[n]);
  EXPECT_NO_THROW(chk->verify_guards());
}

// An operation captured into a graph is checked at every replay, as a launched one is.
TEST_F(DeclarationTest, CapturedOpsAreCheckedAtReplay) {
  constexpr int n = 16;
  auto* buf = static_cast<float*>(chk->allocate_guarded(n * sizeof(float), "graph scratch"));
  bool stray = false;  // the replay's op writes past its range only once this is set
  begin_capture(main);
  main.launch({.name = "captured", .num_tiles = 2, .tile = [buf, &stray](int t) {
                 for (int i = t * 8; i < t * 8 + 8; ++i) buf[i] = 3.0f;
                 if (t == 1 && stray) buf[n] = 3.0f;
               },
               .accesses = {writes(buf, n * sizeof(float))}});
  const GraphExec exec = end_capture(main).instantiate();
  exec.launch(main);
  EXPECT_NO_THROW(main.synchronize());
  EXPECT_TRUE(chk->violations().empty());
  stray = true;
  exec.launch(main);
  expect_violation(main, "captured", "graph scratch");
}

TEST_F(DeclarationTest, CorrectOpsPassAndComputeTheSame) {
  constexpr int n = 64;
  auto* a = static_cast<float*>(chk->allocate_guarded(n * sizeof(float), "a"));
  auto* b = static_cast<float*>(chk->allocate_guarded(n * sizeof(float), "b"));
  main.launch({.name = "fill", .num_tiles = 8, .tile = [a](int t) {
                 for (int i = t * 8; i < t * 8 + 8; ++i) a[i] = static_cast<float>(i);
               },
               .accesses = {writes(a, n * sizeof(float))}});
  main.launch({.name = "scale_upper_half", .num_tiles = 4, .tile = [a, b](int t) {
                 for (int i = n / 2 + t * 8; i < n / 2 + t * 8 + 8; ++i) b[i] = 2.0f * a[i];
               },
               .accesses = {reads(a, n * sizeof(float)), writes(b + n / 2, n / 2 * sizeof(float))}});
  main.launch({.name = "poll_only", .num_tiles = 0, .poll = [] { return true; }});
  // An empty declared write (a buffer this configuration lacks) writes and restores nothing.
  main.launch({.name = "empty_write", .num_tiles = 1, .tile = [](int) {}, .accesses = {writes(a, 0)}});
  EXPECT_NO_THROW(main.synchronize());
  EXPECT_TRUE(chk->violations().empty());
  EXPECT_NO_THROW(chk->verify_guards());
  EXPECT_EQ(b[n - 1], 2.0f * (n - 1));
}

TEST_F(DeclarationTest, TheMiniLayerDeclaresEverythingItWrites) {
  auto san = enable_sanitizer(*dev);  // both tools at once: the declarations they share are right
  {
    test::MiniLayer layer(*dev);
    layer.run();
    layer.run();
    EXPECT_NO_THROW(dev->synchronize());
  }
  EXPECT_TRUE(chk->violations().empty());
  EXPECT_EQ(san->num_reports(), 0u);
}

TEST(Declaration, NeedsASingleWorker) {
  auto dev = make_cpu_device({.num_workers = 2});
  EXPECT_THROW(enable_declaration_check(*dev), std::invalid_argument);
}

}  // namespace
}  // namespace moe::rt
