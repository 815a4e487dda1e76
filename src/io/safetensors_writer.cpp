#include "io/safetensors_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

namespace moe {

uint64_t tensor_bytes(StDType dtype, const std::vector<int64_t>& shape) {
  unsigned __int128 bits = static_cast<unsigned __int128>(st_dtype_bits(dtype));
  for (int64_t d : shape) {
    if (d < 0) throw IoError("tensor shape " + shape_to_string(shape) + " has a negative dimension");
    bits *= static_cast<uint64_t>(d);
    if (bits > (static_cast<unsigned __int128>(1) << 66)) throw IoError("tensor shape " + shape_to_string(shape) + " is too large");
  }
  if (bits % 8 != 0) throw IoError("tensor shape " + shape_to_string(shape) + " is not a whole number of bytes");
  return static_cast<uint64_t>(bits / 8);
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tensors_(std::move(tensors)) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second)
      throw IoError("safetensors writer '" + path_ + "': invalid or duplicate tensor name '" + t.name + "'");
    const uint64_t n = tensor_bytes(t.dtype, t.shape);
    sizes_.push_back(n);
    header[t.name] = {{"dtype", std::string(st_dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  tmp_path_ = path_ + ".tmp." + std::to_string(::getpid());
  out_ = std::fopen(tmp_path_.c_str(), "wb");
  if (out_ == nullptr) throw IoError("cannot create '" + tmp_path_ + "': " + std::strerror(errno));
  // A 4 MiB buffer of our own (stdio ignores the size of a buffer it allocates): glibc then writes whole
  // 4 MiB blocks at 4 MiB-aligned offsets, which the page cache keeps as 2 MiB folios where the file system
  // has large folios, so the next load maps the weights with 2 MiB pages (small writes leave 4 KiB pages:
  // about 10% slower decode here, see MappedFile).
  try {
    buffer_.resize(4 << 20);
    std::setvbuf(out_, buffer_.data(), _IOFBF, buffer_.size());
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    put(len, 8);
    put(text.data(), text.size());
  } catch (...) {  // no destructor runs for a constructor that throws: close (before the buffer goes) and clean up
    std::fclose(out_);
    out_ = nullptr;
    ::unlink(tmp_path_.c_str());
    throw;
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (out_ != nullptr) std::fclose(out_);
  if (!done_ && !tmp_path_.empty()) ::unlink(tmp_path_.c_str());
}

void SafetensorsWriter::put(const void* data, uint64_t bytes) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, out_) != bytes)
    throw IoError("writing '" + tmp_path_ + "' failed: " + std::strerror(errno));
}

void SafetensorsWriter::write(const std::string& name, const void* data, uint64_t bytes) {
  while (current_ < tensors_.size() && written_ == sizes_[current_] && tensors_[current_].name != name) {
    ++current_;
    written_ = 0;
  }
  if (current_ == tensors_.size() || tensors_[current_].name != name)
    throw IoError("safetensors writer '" + path_ + "': tensor '" + name + "' written out of the declared order");
  if (bytes > sizes_[current_] - written_)
    throw IoError("safetensors writer '" + path_ + "': tensor '" + name + "' gets more than its " +
                  std::to_string(sizes_[current_]) + " bytes");
  put(data, bytes);
  written_ += bytes;
}

void SafetensorsWriter::finish() {
  while (current_ < tensors_.size() && written_ == sizes_[current_]) {
    ++current_;
    written_ = 0;
  }
  if (current_ != tensors_.size())
    throw IoError("safetensors writer '" + path_ + "': tensor '" + tensors_[current_].name + "' incomplete (" +
                  std::to_string(written_) + " of " + std::to_string(sizes_[current_]) + " bytes)");
  // On disk before the rename: after a crash the name holds the whole file or is absent (or the old file).
  const bool synced = std::fflush(out_) == 0 && ::fsync(::fileno(out_)) == 0;
  const int sync_errno = errno;
  const int rc = std::fclose(out_);
  out_ = nullptr;
  if (!synced) throw IoError("writing '" + tmp_path_ + "' failed: " + std::strerror(sync_errno));
  if (rc != 0) throw IoError("closing '" + tmp_path_ + "' failed: " + std::strerror(errno));
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    throw IoError("renaming '" + tmp_path_ + "' to '" + path_ + "' failed: " + std::strerror(errno));
  done_ = true;
}

void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back(t.spec);
  SafetensorsWriter w(path, std::move(specs), metadata);
  for (const auto& t : tensors) w.write(t.spec.name, t.data, tensor_bytes(t.spec.dtype, t.spec.shape));
  w.finish();
}

}  // namespace moe
