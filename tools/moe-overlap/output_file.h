// Output files of the tools, written whole or not at all.
//
// One file: write_file_atomically() writes PATH.tmp, flushes it to disk and renames it over PATH, so a
// failure or a kill half way leaves PATH as it was (absent, or the previous complete file).
//
// Several files of one command (bench --json/--svg/--tune, trace --out/--svg): an OutputBatch makes them
// all-or-nothing. While it lives, write_file_atomically() on its thread only stages each file (PATH.tmp,
// complete and flushed); commit() renames them all into place at the end. A batch destroyed without commit()
// (an exception on the way out) removes what it staged, so a command that fails after writing some of its
// outputs (the JSON written, then the SVG's path fails) leaves none of them.
//
//   check_output_paths({{"--json", o.json}, {"--svg", o.svg}});  // at the start: fail before a long run
//   OutputBatch batch;
//   write_file_atomically(o.json, ...);  // staged
//   write_bench_svg(report, o.svg);      // staged (it calls write_file_atomically)
//   batch.commit();                      // both appear
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moe::tools {

// Throws std::runtime_error naming the path on any failure (a PATH that is a directory included); the
// temporary file is removed. Inside an OutputBatch the file is staged and appears at commit().
void write_file_atomically(const std::string& path, std::string_view content);

// Checks, before any work, that each non-empty path can be written: its directory exists and is writable,
// the path is not a directory, and no path is given for two outputs. Each entry is {flag, path}; throws
// std::runtime_error naming the flag and the path.
void check_output_paths(const std::vector<std::pair<std::string, std::string>>& outputs);

class OutputBatch {
 public:
  OutputBatch();
  ~OutputBatch();  // removes every file staged since the last commit()
  OutputBatch(const OutputBatch&) = delete;
  OutputBatch& operator=(const OutputBatch&) = delete;

  // Renames every staged file into place. If one rename fails, the files not yet renamed are removed and so
  // are the ones this commit already put in place; throws std::runtime_error naming the path.
  void commit();

 private:
  friend void write_file_atomically(const std::string& path, std::string_view content);
  std::vector<std::string> staged_;  // final paths; each one's PATH.tmp is complete
  OutputBatch* outer_;
};

}  // namespace moe::tools
