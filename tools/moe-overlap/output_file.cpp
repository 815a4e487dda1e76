#include "output_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace moe::tools {

namespace fs = std::filesystem;

namespace {

thread_local OutputBatch* current_batch = nullptr;

std::string tmp_of(const std::string& path) { return path + ".tmp"; }

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error("cannot write '" + path + "': " + why);
}

// PATH.tmp written in full and on disk, or nothing (and an exception naming PATH).
void write_tmp(const std::string& path, std::string_view content) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(path, "it is a directory");
  const std::string tmp = tmp_of(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(path, std::string(std::strerror(errno)) + " (writing '" + tmp + "')");
  bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  ok = ok && std::fflush(f) == 0;
  ok = ok && ::fsync(::fileno(f)) == 0;
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    fail(path, std::strerror(err));
  }
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view content) {
  if (OutputBatch* b = current_batch) {
    if (std::find(b->staged_.begin(), b->staged_.end(), path) != b->staged_.end())
      fail(path, "the same path is given for two outputs");
    write_tmp(path, content);
    b->staged_.push_back(path);
    return;
  }
  write_tmp(path, content);
  if (std::rename(tmp_of(path).c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp_of(path).c_str());
    fail(path, why);
  }
}

void check_output_paths(const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [flag, path] = outputs[i];
    if (path.empty()) continue;
    const std::string at = flag + " '" + path + "': ";
    for (size_t j = 0; j < i; ++j)
      if (outputs[j].second == path) throw std::runtime_error(at + "the same path as " + outputs[j].first);
    std::error_code ec;
    if (fs::is_directory(path, ec)) throw std::runtime_error(at + "cannot write: it is a directory");
    const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
    if (!fs::exists(parent, ec))
      throw std::runtime_error(at + "cannot write: directory '" + parent.string() + "' does not exist");
    if (!fs::is_directory(parent, ec))
      throw std::runtime_error(at + "cannot write: '" + parent.string() + "' is not a directory");
    if (::access(parent.c_str(), W_OK) != 0)
      throw std::runtime_error(at + "cannot write in '" + parent.string() + "': " + std::strerror(errno));
  }
}

OutputBatch::OutputBatch() : outer_(current_batch) { current_batch = this; }

OutputBatch::~OutputBatch() {
  current_batch = outer_;
  for (const std::string& p : staged_) std::remove(tmp_of(p).c_str());
}

void OutputBatch::commit() {
  for (size_t i = 0; i < staged_.size(); ++i) {
    if (std::rename(tmp_of(staged_[i]).c_str(), staged_[i].c_str()) == 0) continue;
    const std::string why = std::strerror(errno), path = staged_[i];
    for (size_t j = 0; j < i; ++j) std::remove(staged_[j].c_str());
    for (size_t j = i; j < staged_.size(); ++j) std::remove(tmp_of(staged_[j]).c_str());
    staged_.clear();
    fail(path, why);
  }
  staged_.clear();  // in place now; files staged after this wait for the next commit()
}

}  // namespace moe::tools
