// Peak resident memory of loading a real-size Qwen3-Next-80B-A3B layer (3 GiB bf16) and touching what one
// decode token reads (router, 10 experts, shared expert, shared gate): a report, not a timed test, so it is
// disabled by default. Run:
//   build-io/tests/test_io_rss --gtest_also_run_disabled_tests --gtest_filter='*RealLayer*'
// Needs ~3.1 GiB free in $TMPDIR (or /tmp); the checkpoint is written by a child process so that the writer's
// memory does not count, and deleted afterwards.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "io/checkpoint.h"
#include "io/make_checkpoint.h"
#include "io/mapped_file.h"
#include "io/rss.h"
#include "io/safetensors_writer.h"
#include "test_io_util.h"

namespace moe {
namespace {

// bench resets the peak after its bandwidth probe so that the report is the layer's own.
TEST(IoRss, ResetPeakLeavesAFreedBufferOut) {
  if (!reset_peak_rss()) GTEST_SKIP() << "/proc/self/clear_refs is not writable here";
  constexpr size_t kBytes = size_t{64} << 20;
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, kBytes);
  const int64_t with_buffer = peak_rss_bytes();
  EXPECT_GE(with_buffer, current_rss_bytes() - (int64_t{1} << 20));
  munmap(p, kBytes);
  ASSERT_TRUE(reset_peak_rss());
  EXPECT_LT(peak_rss_bytes(), with_buffer - (int64_t{32} << 20));
}

// Reads every 4 KiB page of a mapping.
void touch_all(const MappedFile& f) {
  const volatile uint8_t* p = f.data();
  for (uint64_t i = 0; i < f.size(); i += 4096) (void)p[i];
}

// The share of a file's mapped pages in 2 MiB pages once every page is touched.
double huge_share(const std::string& path) {
  const MappedFile f(path);
  touch_all(f);
  const PageCoverage c = page_coverage({{f.data(), f.size()}});
  return c.resident_bytes > 0 ? static_cast<double>(c.huge_bytes) / static_cast<double>(c.resident_bytes) : -1;
}

TEST(IoRss, PageCoverageCountsEachTouchedMappingOnce) {
  test::ScratchDir dir;
  constexpr size_t kBytes = size_t{8} << 20;
  test::write_bytes(dir / "f.bin", std::string(kBytes, 'x'));
  const MappedFile f(dir / "f.bin");
  touch_all(f);
  const PageCoverage one = page_coverage({{f.data(), f.size()}});
  if (one.resident_bytes < 0) GTEST_SKIP() << "/proc/self/smaps is unavailable";
  EXPECT_GE(one.resident_bytes, static_cast<int64_t>(kBytes));
  EXPECT_LE(one.huge_bytes, one.resident_bytes);
  // Two ranges inside the same mapping: the mapping still counts once.
  const PageCoverage two = page_coverage({{f.data(), 4096}, {f.data() + kBytes / 2, 4096}});
  EXPECT_EQ(two.resident_bytes, one.resident_bytes);
  // No range, or an empty one: nothing.
  EXPECT_EQ(page_coverage({}).resident_bytes, 0);
  EXPECT_EQ(page_coverage({{f.data(), 0}}).resident_bytes, 0);
}

TEST(IoRss, DropCachedPagesNamesAMissingFile) {
  test::ScratchDir dir;
  test::write_bytes(dir / "f.bin", std::string(4096, 'x'));
  EXPECT_TRUE(MappedFile::drop_cached_pages(dir / "f.bin"));
  errno = 0;
  EXPECT_FALSE(MappedFile::drop_cached_pages(dir / "missing.bin"));
  EXPECT_EQ(errno, ENOENT);
}

// Where this kernel keeps a file written in large aligned blocks in 2 MiB folios (a probe file written with
// one write() shows whether it does), a safetensors file written in small pieces must land the same way:
// the writer's 4 MiB buffer turns the pieces into aligned blocks, so a checkpoint from make-checkpoint maps
// with 2 MiB pages.
TEST(IoRss, WriterLeavesItsFileInHugePagesWhereTheKernelCan) {
  test::ScratchDir dir;
  constexpr size_t kBytes = size_t{16} << 20;
  const std::vector<char> bytes(kBytes, 1);
  {
    const int fd = ::open((dir / "probe.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, bytes.data(), kBytes), static_cast<ssize_t>(kBytes));
    ::close(fd);
  }
  const double probe = huge_share(dir / "probe.bin");
  if (probe <= 0.5) GTEST_SKIP() << "this kernel or file system keeps written files in small pages (" << probe << ")";
  SafetensorsWriter w(dir / "t.safetensors", {{"t", StDType::kU8, {static_cast<int64_t>(kBytes)}}});
  for (size_t i = 0; i < kBytes; i += 64 << 10) w.write("t", bytes.data() + i, 64 << 10);
  w.finish();
  EXPECT_GT(huge_share(dir / "t.safetensors"), 0.5);
}

// Reads one byte per 4 KiB page (every page of the matrix is faulted in, as a GEMV would).
uint64_t touch(const WeightView& w, int64_t* bytes) {
  const auto* p = static_cast<const uint8_t*>(w.data);
  const int64_t n = w.rows * w.cols * static_cast<int64_t>(dtype_size(w.dtype));
  uint64_t sum = 0;
  for (int64_t i = 0; i < n; i += 4096) sum += p[i];
  sum += p[n - 1];
  *bytes += n;
  return sum;
}

TEST(IoRss, DISABLED_RealLayerLoadTouchesOnlyWhatItReads) {
  test::ScratchDir dir;
  const MoeConfig c = find_preset("qwen3-next-80b-a3b").config;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      write_checkpoint(dir.path(), c, {});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      _exit(1);
    }
    std::fprintf(stderr, "writer peak RSS: %.1f MiB\n", static_cast<double>(peak_rss_bytes()) / (1 << 20));
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const int64_t before = peak_rss_bytes();
  const LayerWeights w = load_layer(dir.path(), c, 0);
  int64_t touched = 0;
  uint64_t sum = touch(w.router, &touched);
  for (int e = 0; e < c.top_k; ++e) {
    sum += touch(w.experts[static_cast<size_t>(e) * 37 % 512].gate, &touched);
    sum += touch(w.experts[static_cast<size_t>(e) * 37 % 512].up, &touched);
    sum += touch(w.experts[static_cast<size_t>(e) * 37 % 512].down, &touched);
  }
  sum += touch(w.shared.gate, &touched) + touch(w.shared.up, &touched) + touch(w.shared.down, &touched);
  sum += touch(w.shared_gate, &touched);
  const int64_t peak = peak_rss_bytes();
  const double mib = 1 << 20;
  std::printf("layer bytes %.1f MiB; touched %.1f MiB; peak RSS %.1f MiB (before load %.1f MiB, growth %.1f MiB); "
              "target 1.1 x touched + 64 MiB = %.1f MiB  [checksum %llu]\n",
              static_cast<double>(c.layer_weight_bytes(c.num_experts, 2)) / mib, static_cast<double>(touched) / mib,
              static_cast<double>(peak) / mib, static_cast<double>(before) / mib,
              static_cast<double>(peak - before) / mib, (1.1 * static_cast<double>(touched) + 64 * mib) / mib,
              static_cast<unsigned long long>(sum));
  EXPECT_LT(static_cast<double>(peak), 1.1 * static_cast<double>(touched) + 64 * mib);
}

}  // namespace
}  // namespace moe
