// Helpers shared by the io tests: a scratch directory removed at the end, byte images of files, and an
// expectation that a call throws an error whose message contains given words.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace moe::test {

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "moe_io_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Runs `f`, which must throw an exception derived from std::exception whose what() contains every word.
template <class F>
void expect_error(F&& f, const std::vector<std::string>& words, const std::string& context = "") {
  try {
    f();
    ADD_FAILURE() << context << ": expected an error mentioning '" << (words.empty() ? "" : words[0]) << "'";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << context << ": '" << w << "' not in: " << msg;
  }
}

}  // namespace moe::test
