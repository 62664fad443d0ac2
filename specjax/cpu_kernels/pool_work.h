// Work items claimed from a shared counter by the calling thread and by
// helpers on XLA's intra-op thread pool, shared by specjax's CPU kernels.
//
// A helper that starts after every item is claimed returns at once, and the
// caller only waits for items already running, so a call cannot deadlock
// however many pool threads are free.

#ifndef SPECJAX_CPU_KERNELS_POOL_WORK_H_
#define SPECJAX_CPU_KERNELS_POOL_WORK_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace specjax {

// Job: `int64_t num_items`, `void item(int64_t)` (thread-safe across items),
// and the two counters below.
struct PoolCounters {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> finished{0};
};

template <typename Job>
void claim_items(Job& job) {
  for (int64_t i; (i = job.counters.next.fetch_add(1, std::memory_order_relaxed)) < job.num_items;) {
    job.item(i);
    job.counters.finished.fetch_add(1, std::memory_order_release);
  }
}

// Runs every item of `job` on the calling thread and up to the pool's other
// threads; returns when all are done. The pool's helpers hold `job` alive.
template <typename Job>
void run_on_pool(xla::ffi::ThreadPool& pool, std::shared_ptr<Job> job) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t helpers = std::min(threads, job->num_items) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([job] { claim_items(*job); });
  claim_items(*job);
  while (job->counters.finished.load(std::memory_order_acquire) < job->num_items) {
    std::this_thread::yield();
  }
}

// Output rows [0, O) of a matrix product in chunks of whole panels of
// `rows_per_panel`, about 8 chunks per thread so that a slow thread does not
// hold the call up, each chunk run as rows(o0, o1) on the pool.
// Rows of x per group when N rows are taken at most `max_group` at a time: as few
// groups as that allows, of even sizes (20 rows at most 9: 7, 7 and 6, not 9, 9 and 2).
inline int64_t even_group_size(int64_t N, int64_t max_group) {
  const int64_t groups = (N + max_group - 1) / max_group;
  return (N + groups - 1) / groups;
}

template <typename RowsFn>
struct RowChunks {
  RowChunks(RowsFn rows, int64_t O, int64_t rows_per_chunk)
      : rows(rows), O(O), rows_per_chunk(rows_per_chunk),
        num_items((O + rows_per_chunk - 1) / rows_per_chunk) {}

  RowsFn rows;
  int64_t O, rows_per_chunk, num_items;
  PoolCounters counters;

  void item(int64_t c) {
    const int64_t o0 = c * rows_per_chunk;
    rows(o0, std::min(O, o0 + rows_per_chunk));
  }
};

template <typename RowsFn>
void run_row_chunks(xla::ffi::ThreadPool& pool, int64_t O, int64_t rows_per_panel, RowsFn rows) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t panels = (O + rows_per_panel - 1) / rows_per_panel;
  const int64_t rows_per_chunk = std::max<int64_t>(1, panels / (8 * threads)) * rows_per_panel;
  run_on_pool(pool, std::make_shared<RowChunks<RowsFn>>(rows, O, rows_per_chunk));
}

}  // namespace specjax

#endif  // SPECJAX_CPU_KERNELS_POOL_WORK_H_
