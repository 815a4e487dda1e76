// Expert parallelism's operations (ops.h, EpBuffers). On rank r of N, with C rows per peer block:
//   ep.pack      each (token, slot) pair's row goes to the block of the rank that owns its expert, pairs
//                ascending; pair_row[p] = q * C + i, where it will come back (tile q: owner q's block)
//   ep.dispatch  the blocks to their owners (a polling operation: the exchange runs while the workers take
//                other streams' tiles); normal mode sends the counts first, low-latency mode one round into
//                receive blocks of C rows, the count in the block's header
//   ep.group     the received rows by local expert (origin rank ascending, then arrival), gathered into xg
//                with the same plan (offsets, row tiles) the one-process dispatch writes
//   ep.return    each expert output back into its origin's block, in arrival order (tile q: origin q)
//   ep.combine   the blocks back to their origins
// Every row's expert output comes from the same kernels as in one process (kernels/linear.h: a row's bits
// depend only on the x row, the weight rows and the ISA), and combine sums each token's slots in slot order,
// so each rank's output is bitwise the one-process output for its tokens.
#include <algorithm>
#include <cstring>
#include <string>

#include "layer/dispatch.h"
#include "layer/ops/ops.h"

namespace moe::ops {

namespace {

constexpr int kTagCounts = 101, kTagMeta = 102, kTagRows = 103, kTagBack = 104;

size_t row_bytes(const Context& c) { return static_cast<size_t>(c.config->hidden) * sizeof(float); }

}  // namespace

rt::Op make_ep_pack_op(const Context& c) {
  const EpBuffers e = c.ep;
  const int64_t pairs = c.tokens * c.config->top_k, k = c.config->top_k, num_experts = c.config->num_experts;
  const int32_t* ids = c.routed.topk_ids;
  int32_t* pair_row = c.routed.pair_row;
  const float* x = c.x;
  const size_t rb = row_bytes(c);
  const int64_t cap = e.capacity;
  rt::Op op{.name = "ep.pack", .num_tiles = e.ranks};
  op.tile = [=](int q) {
    const int64_t first = ep::first_expert(num_experts, e.ranks, q), last = ep::first_expert(num_experts, e.ranks, q + 1);
    int32_t* meta = e.send_meta + q * (1 + cap);
    float* rows = e.send_rows + q * cap * (rb / sizeof(float));
    int32_t n = 0;
    for (int64_t p = 0; p < pairs; ++p) {
      if (ids[p] < first || ids[p] >= last) continue;
      meta[1 + n] = static_cast<int32_t>(ids[p] - first);
      std::memcpy(rows + n * (rb / sizeof(float)), x + (p / k) * (rb / sizeof(float)), rb);
      pair_row[p] = static_cast<int32_t>(q * cap + n);
      ++n;
    }
    meta[0] = n;
  };
  op.accesses = {rt::reads(ids, static_cast<size_t>(pairs) * 4), rt::reads(x, static_cast<size_t>(c.tokens) * rb),
                 rt::writes(pair_row, static_cast<size_t>(pairs) * 4),
                 rt::writes(e.send_meta, static_cast<size_t>(e.ranks * (1 + cap)) * 4),
                 rt::writes(e.send_rows, static_cast<size_t>(e.ranks * cap) * rb)};
  return op;
}

namespace {

// Posts the row round of the dispatch: block q (its header, ids and rows) to rank q; from each rank, into
// its receive block, either exactly the count it announced (normal) or up to C rows (low-latency).
void post_rows(const EpBuffers& e, size_t rb, bool exact) {
  ep::Transfer& t = *e.dispatch;
  const int64_t cap = e.capacity;
  t.num_sends = t.num_recvs = 0;
  for (int q = 0; q < e.ranks; ++q) {
    const int32_t* meta = e.send_meta + q * (1 + cap);
    const size_t n = static_cast<size_t>(meta[0]);
    t.sends[t.num_sends++] = {.peer = q, .data = meta, .bytes = (1 + n) * 4, .tag = kTagMeta};
    t.sends[t.num_sends++] = {.peer = q, .data = e.send_rows + q * cap * (rb / 4), .bytes = n * rb, .tag = kTagRows};
    int32_t* rmeta = e.recv_meta + q * (1 + cap);
    const size_t m = exact ? static_cast<size_t>(rmeta[0]) : static_cast<size_t>(cap);
    t.recvs[t.num_recvs++] = {.peer = q, .data = rmeta, .capacity = (1 + m) * 4, .tag = kTagMeta};
    t.recvs[t.num_recvs++] = {.peer = q, .data = e.recv_rows + q * cap * (rb / 4), .capacity = m * rb, .tag = kTagRows};
  }
  e.comm->start(t);
}

// After the row round: every block's count within C and its rows all there.
void check_received(const EpBuffers& e, size_t rb) {
  const ep::Transfer& t = *e.dispatch;
  for (int q = 0; q < e.ranks; ++q) {
    const int32_t n = e.recv_meta[q * (1 + e.capacity)];
    const size_t got = t.recvs[2 * static_cast<size_t>(q) + 1].received;
    if (n < 0 || n > e.capacity || got != static_cast<size_t>(n) * rb)
      throw ep::ExchangeError("ep.dispatch on rank " + std::to_string(e.comm->rank()) + ": rank " + std::to_string(q) +
                              " announced " + std::to_string(n) + " rows (at most " + std::to_string(e.capacity) +
                              ") and sent " + std::to_string(got) + " bytes of rows");
  }
}

}  // namespace

rt::Op make_ep_dispatch_op(const Context& c) {
  const EpBuffers e = c.ep;
  const size_t rb = row_bytes(c);
  rt::Op op{.name = "ep.dispatch", .num_tiles = 0};
  op.poll = [e, rb]() {
    int& phase = *e.dispatch_phase;
    if (phase == 0) {
      if (e.mode == ep::ExchangeMode::kNormal) {
        ep::Transfer& t = *e.counts;
        t.num_sends = t.num_recvs = static_cast<size_t>(e.ranks);
        for (int q = 0; q < e.ranks; ++q) {
          t.sends[q] = {.peer = q, .data = e.send_meta + q * (1 + e.capacity), .bytes = 4, .tag = kTagCounts};
          t.recvs[q] = {.peer = q, .data = e.recv_meta + q * (1 + e.capacity), .capacity = 4, .tag = kTagCounts};
        }
        e.comm->start(t);
        phase = 1;
      } else {
        post_rows(e, rb, /*exact=*/false);
        phase = 2;
      }
    }
    if (phase == 1) {
      if (!e.comm->test(*e.counts)) return false;
      for (int q = 0; q < e.ranks; ++q) {
        const int32_t n = e.recv_meta[q * (1 + e.capacity)];
        if (n < 0 || n > e.capacity)
          throw ep::ExchangeError("ep.dispatch on rank " + std::to_string(e.comm->rank()) + ": rank " +
                                  std::to_string(q) + " announced " + std::to_string(n) + " rows, at most " +
                                  std::to_string(e.capacity) + " fit");
      }
      post_rows(e, rb, /*exact=*/true);
      phase = 2;
    }
    if (!e.comm->test(*e.dispatch)) return false;
    phase = 0;
    check_received(e, rb);
    return true;
  };
  const size_t blocks = static_cast<size_t>(e.ranks * e.capacity);
  op.accesses = {rt::reads(e.send_meta, static_cast<size_t>(e.ranks) * (1 + e.capacity) * 4),
                 rt::reads(e.send_rows, blocks * rb),
                 rt::writes(e.recv_meta, static_cast<size_t>(e.ranks) * (1 + e.capacity) * 4),
                 rt::writes(e.recv_rows, blocks * rb)};
  return op;
}

rt::Op make_ep_group_op(const Context& c) {
  const EpBuffers e = c.ep;
  const RoutedBuffers b = c.routed;
  const int64_t el = c.weights->num_local_experts(), cap = e.capacity;
  const size_t rb = row_bytes(c);
  const int64_t max_rows = c.expert_rows;
  const SharedChainReset reset_shared_chain = shared_chain_reset(c);
  rt::Op op{.name = "ep.group", .num_tiles = 1};
  op.tile = [=](int) {
    reset_shared_chain();
    int32_t* cursor = e.group_cursor;
    std::fill(cursor, cursor + el, 0);
    for (int q = 0; q < e.ranks; ++q) {
      const int32_t* meta = e.recv_meta + q * (1 + cap);
      for (int32_t i = 0; i < meta[0]; ++i) {
        if (meta[1 + i] < 0 || meta[1 + i] >= el)
          throw ep::ExchangeError("ep.group on rank " + std::to_string(e.comm->rank()) + ": rank " + std::to_string(q) +
                                  " sent a row for local expert " + std::to_string(meta[1 + i]) + " of " +
                                  std::to_string(el));
        ++cursor[meta[1 + i]];
      }
    }
    int32_t running = 0;
    for (int64_t x = 0; x < el; ++x) {
      const int32_t n = cursor[x];
      cursor[x] = running;
      running += n;
    }
    write_row_plan(cursor, running, el, b.offsets, b.row_tiles, b.num_row_tiles, b.row_progress);
    for (int q = 0; q < e.ranks; ++q) {
      const int32_t* meta = e.recv_meta + q * (1 + cap);
      for (int32_t i = 0; i < meta[0]; ++i) {
        const int32_t r = cursor[meta[1 + i]]++;
        e.recv_group[q * cap + i] = r;
        std::memcpy(b.xg + r * (rb / 4), e.recv_rows + (q * cap + i) * (rb / 4), rb);
      }
    }
  };
  const size_t blocks = static_cast<size_t>(e.ranks * cap);
  op.accesses = {rt::reads(e.recv_meta, static_cast<size_t>(e.ranks) * (1 + cap) * 4),
                 rt::reads(e.recv_rows, blocks * rb),
                 rt::writes(e.group_cursor, static_cast<size_t>(el) * 4),
                 rt::writes(e.recv_group, blocks * 4),
                 rt::writes(b.offsets, static_cast<size_t>(el + 1) * 4),
                 rt::writes(b.row_tiles, static_cast<size_t>(max_row_tiles(max_rows, el) * 3) * 4),
                 rt::writes(b.num_row_tiles, 4),
                 rt::writes(b.row_progress, static_cast<size_t>(max_row_tiles(max_rows, el) * 2) * 4),
                 reset_shared_chain.access(),
                 rt::writes(b.xg, static_cast<size_t>(max_rows) * rb)};
  return op;
}

rt::Op make_ep_return_op(const Context& c) {
  const EpBuffers e = c.ep;
  const float* og = c.routed.og;
  const int64_t cap = e.capacity;
  const size_t rb = row_bytes(c);
  rt::Op op{.name = "ep.return", .num_tiles = e.ranks};
  op.tile = [=](int q) {
    const int32_t n = e.recv_meta[q * (1 + cap)];
    for (int32_t i = 0; i < n; ++i)
      std::memcpy(e.back_rows + (q * cap + i) * (rb / 4), og + e.recv_group[q * cap + i] * (rb / 4), rb);
  };
  const size_t blocks = static_cast<size_t>(e.ranks * cap);
  op.accesses = {rt::reads(e.recv_meta, static_cast<size_t>(e.ranks) * (1 + cap) * 4),
                 rt::reads(e.recv_group, blocks * 4), rt::reads(og, static_cast<size_t>(c.expert_rows) * rb),
                 rt::writes(e.back_rows, blocks * rb)};
  return op;
}

rt::Op make_ep_combine_op(const Context& c) {
  const EpBuffers e = c.ep;
  const size_t rb = row_bytes(c);
  rt::Op op{.name = "ep.combine", .num_tiles = 0};
  op.poll = [e, rb]() {
    ep::Transfer& t = *e.combine;
    const int64_t cap = e.capacity;
    if (!t.active) {
      t.num_sends = t.num_recvs = 0;
      for (int q = 0; q < e.ranks; ++q) {
        const size_t back = static_cast<size_t>(e.recv_meta[q * (1 + cap)]);   // what q sent here
        const size_t mine = static_cast<size_t>(e.send_meta[q * (1 + cap)]);   // what this rank sent q
        t.sends[t.num_sends++] = {.peer = q, .data = e.back_rows + q * cap * (rb / 4), .bytes = back * rb, .tag = kTagBack};
        t.recvs[t.num_recvs++] = {.peer = q, .data = e.ret_rows + q * cap * (rb / 4), .capacity = mine * rb, .tag = kTagBack};
      }
      e.comm->start(t);
    }
    if (!e.comm->test(t)) return false;
    for (int q = 0; q < e.ranks; ++q) {
      const size_t mine = static_cast<size_t>(e.send_meta[q * (1 + cap)]);
      if (t.recvs[static_cast<size_t>(q)].received != mine * rb)
        throw ep::ExchangeError("ep.combine on rank " + std::to_string(e.comm->rank()) + ": rank " + std::to_string(q) +
                                " returned " + std::to_string(t.recvs[static_cast<size_t>(q)].received / rb) +
                                " rows, " + std::to_string(mine) + " were sent to it");
    }
    return true;
  };
  const size_t blocks = static_cast<size_t>(e.ranks * e.capacity);
  op.accesses = {rt::reads(e.recv_meta, static_cast<size_t>(e.ranks) * (1 + e.capacity) * 4),
                 rt::reads(e.send_meta, static_cast<size_t>(e.ranks) * (1 + e.capacity) * 4),
                 rt::reads(e.back_rows, blocks * rb), rt::writes(e.ret_rows, blocks * rb)};
  return op;
}

}  // namespace moe::ops
