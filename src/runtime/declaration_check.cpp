// The declaration check: runs each operation alone and compares the registered buffers outside its declared
// writes before and after. See declaration_check.h.
#include "runtime/declaration_check.h"

#include <algorithm>
#include <cstring>
#include <functional>

namespace moe::rt {

struct DeclarationChecker::Snapshot {
  std::vector<Buffer> buffers;
  std::vector<std::vector<unsigned char>> bytes;
};

namespace {

// A declared write of at least one byte. An empty one (a buffer some configurations do not have, such as
// the fused schedule's shared-expert counters in a layer without a shared expert) has nothing to save or
// restore, and memcpy must not be handed its empty copy's null data.
bool writes_bytes(const Access& a) { return a.mode != AccessMode::kRead && a.ptr != nullptr && a.bytes > 0; }

bool declared_write(const AccessList& declared, const unsigned char* p) {
  for (const Access& a : declared) {
    if (!writes_bytes(a)) continue;
    auto* b = static_cast<const unsigned char*>(a.ptr);
    if (p >= b && p < b + a.bytes) return true;
  }
  return false;
}

std::string list_writes(const AccessList& declared) {
  std::string s;
  for (const Access& a : declared) {
    if (a.mode == AccessMode::kRead) continue;
    if (!s.empty()) s += ", ";
    s += std::to_string(a.bytes) + " bytes at " + std::to_string(reinterpret_cast<uintptr_t>(a.ptr));
  }
  return s.empty() ? "none" : s;
}

}  // namespace

DeclarationChecker::DeclarationChecker(bool throw_in_op, bool check_reads)
    : throw_in_op_(throw_in_op), check_reads_(check_reads) {}
DeclarationChecker::~DeclarationChecker() = default;

void DeclarationChecker::add_buffer(const void* p, size_t bytes, std::string name) {
  if (p == nullptr || bytes == 0) return;
  std::lock_guard lk(mu_);
  buffers_.push_back({static_cast<const unsigned char*>(p), bytes, std::move(name)});
}

void DeclarationChecker::remove_buffer(const void* p) {
  std::lock_guard lk(mu_);
  std::erase_if(buffers_, [&](const Buffer& b) { return b.begin == p; });
}

void* DeclarationChecker::allocate_guarded(size_t bytes, std::string name) {
  Guarded g;
  g.storage = std::make_unique<unsigned char[]>(bytes + 2 * kGuardBytes);
  g.bytes = bytes;
  g.name = name;
  std::memset(g.storage.get(), kGuardByte, kGuardBytes);
  std::memset(g.storage.get() + kGuardBytes + bytes, kGuardByte, kGuardBytes);
  unsigned char* user = g.storage.get() + kGuardBytes;
  std::lock_guard lk(mu_);
  // The whole span is registered: the guard zones are never declared, so a write there is always caught.
  buffers_.push_back({g.storage.get(), bytes + 2 * kGuardBytes, name + " (with guard zones of " +
                                                                    std::to_string(kGuardBytes) + " bytes)"});
  guarded_.push_back(std::move(g));
  return user;
}

void DeclarationChecker::verify_guards() const {
  std::lock_guard lk(mu_);
  for (const Guarded& g : guarded_) {
    const unsigned char* front = g.storage.get();
    const unsigned char* back = front + kGuardBytes + g.bytes;
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (front[i] != kGuardByte) {
        throw DeclarationError("guard zone before buffer '" + g.name + "' overwritten at byte -" +
                               std::to_string(kGuardBytes - i));
      }
      if (back[i] != kGuardByte) {
        throw DeclarationError("guard zone after buffer '" + g.name + "' (" + std::to_string(g.bytes) +
                               " bytes) overwritten at byte +" + std::to_string(g.bytes + i));
      }
    }
  }
}

std::vector<std::string> DeclarationChecker::violations() const {
  std::lock_guard lk(mu_);
  return violations_;
}

DeclarationChecker::Snapshot DeclarationChecker::take_snapshot(const AccessList& declared) const {
  Snapshot s;
  {
    std::lock_guard lk(mu_);
    s.buffers = buffers_;
  }
  s.bytes.reserve(s.buffers.size());
  for (const Buffer& b : s.buffers) s.bytes.emplace_back(b.begin, b.begin + b.bytes);
  return s;
}

void DeclarationChecker::compare(const Snapshot& before, const std::string& op, const std::string& stream,
                                 const AccessList& declared) {
  for (size_t i = 0; i < before.buffers.size(); ++i) {
    const Buffer& b = before.buffers[i];
    const std::vector<unsigned char>& old = before.bytes[i];
    if (std::memcmp(old.data(), b.begin, b.bytes) == 0) continue;
    for (size_t k = 0; k < b.bytes; ++k) {
      if (old[k] == b.begin[k] || declared_write(declared, b.begin + k)) continue;
      std::string msg = "declaration check: op '" + op + "' on stream '" + stream + "' wrote byte " +
                        std::to_string(k) + " of buffer '" + b.name + "' (" + std::to_string(b.bytes) +
                        " bytes at " + std::to_string(reinterpret_cast<uintptr_t>(b.begin)) +
                        ") outside its declared writes (" + list_writes(declared) + ")";
      {
        std::lock_guard lk(mu_);
        violations_.push_back(msg);
      }
      if (throw_in_op_) throw DeclarationError(msg);
      break;
    }
  }
}

namespace {

// The bytes of every declared write range, as the operation left them.
std::vector<std::vector<unsigned char>> written_bytes(const AccessList& declared) {
  std::vector<std::vector<unsigned char>> out;
  for (const Access& a : declared) {
    if (!writes_bytes(a)) continue;
    auto* b = static_cast<const unsigned char*>(a.ptr);
    out.emplace_back(b, b + a.bytes);
  }
  return out;
}

void restore_written(const AccessList& declared, const std::vector<std::vector<unsigned char>>& saved) {
  size_t i = 0;
  for (const Access& a : declared) {
    if (!writes_bytes(a)) continue;
    std::memcpy(const_cast<void*>(a.ptr), saved[i++].data(), a.bytes);  // a declared write: ours to restore
  }
}

}  // namespace

// Before the real run, the operation runs on copies of the world in which every registered byte it did not
// declare holds 0x00, then 0xFF; each time, what it wrote is compared with the real run's result and the
// state is put back. An operation whose declared writes depend on undeclared bytes read them.
void DeclarationChecker::probe_reads(const Snapshot& before, const std::function<void()>& run,
                                     const std::string& op, const std::string& stream, const AccessList& declared) {
  const auto original_writes = written_bytes(declared);
  auto fill_undeclared = [&](unsigned char value) {
    for (const Buffer& b : before.buffers) {
      auto* p = const_cast<unsigned char*>(b.begin);  // registered memory: the checker owns its contents here
      // The declared ranges inside this buffer, sorted; the gaps between them are filled.
      std::vector<std::pair<size_t, size_t>> kept;
      for (const Access& a : declared) {
        auto* q = static_cast<const unsigned char*>(a.ptr);
        if (q == nullptr || q + a.bytes <= b.begin || q >= b.begin + b.bytes) continue;
        const size_t lo = q > b.begin ? static_cast<size_t>(q - b.begin) : 0;
        kept.emplace_back(lo, std::min(b.bytes, static_cast<size_t>(q + a.bytes - b.begin)));
      }
      std::sort(kept.begin(), kept.end());
      size_t at = 0;
      for (const auto& [lo, hi] : kept) {
        if (lo > at) std::memset(p + at, value, lo - at);
        at = std::max(at, hi);
      }
      if (at < b.bytes) std::memset(p + at, value, b.bytes - at);
    }
  };
  auto restore_all = [&] {
    for (size_t i = 0; i < before.buffers.size(); ++i)
      std::memcpy(const_cast<unsigned char*>(before.buffers[i].begin), before.bytes[i].data(), before.buffers[i].bytes);
    restore_written(declared, original_writes);
  };
  std::vector<std::vector<unsigned char>> probed[2];
  for (int i = 0; i < 2; ++i) {
    fill_undeclared(i == 0 ? 0x00 : 0xFF);
    run();
    probed[i] = written_bytes(declared);
    restore_all();
  }
  run();  // the real run, on the real contents
  const auto real = written_bytes(declared);
  if (probed[0] == real && probed[1] == real) return;
  std::string msg = "declaration check: op '" + op + "' on stream '" + stream +
                    "' read registered memory it did not declare: its declared writes change when the "
                    "undeclared bytes of the registered buffers change (declared: " +
                    list_writes(declared) + " written; reads must cover every byte it reads)";
  {
    std::lock_guard lk(mu_);
    violations_.push_back(msg);
  }
  if (throw_in_op_) throw DeclarationError(msg);
}

Op DeclarationChecker::checked(Op op, const std::string& stream_name) {
  if (op.poll || !op.tile || op.num_tiles <= 0) return op;
  auto self = shared_from_this();
  auto inner = std::move(op.tile);
  int num_tiles = op.num_tiles;
  op.num_tiles = 1;
  op.tile = [self, inner = std::move(inner), num_tiles, name = op.name, stream_name,
             declared = op.accesses](int) {
    Snapshot before = self->take_snapshot(declared);
    auto run = [&] {
      for (int t = 0; t < num_tiles; ++t) inner(t);
    };
    if (self->check_reads_) {
      self->probe_reads(before, run, name, stream_name, declared);
    } else {
      run();
    }
    self->compare(before, name, stream_name, declared);
  };
  return op;
}

void DeclarationChecker::before_launch(const Stream& s, Op& op) { op = checked(std::move(op), s.name()); }

void DeclarationChecker::on_alloc(const void* p, size_t bytes) { add_buffer(p, bytes, "notified allocation"); }
void DeclarationChecker::on_free(const void* p, size_t bytes) { remove_buffer(p); }

std::shared_ptr<DeclarationChecker> enable_declaration_check(Device& device, bool throw_in_op, bool check_reads) {
  if (device.num_workers() != 1) {
    throw std::invalid_argument("enable_declaration_check: the device has " + std::to_string(device.num_workers()) +
                                " workers; the check compares memory around each operation and needs a device "
                                "with exactly one (CpuDeviceOptions::num_workers = 1)");
  }
  auto checker = std::make_shared<DeclarationChecker>(throw_in_op, check_reads);
  device.add_interposer(checker);  // wraps every operation
  device.add_observer(checker);    // registers announced buffers
  return checker;
}

}  // namespace moe::rt
