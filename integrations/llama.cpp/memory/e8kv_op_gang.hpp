// The threads of one ggml custom op as an e8kv::Executor: thread 0 does the layer's work and hands
// each parallel loop (attention heads, chunks of codes, blocks of a prompt's queries) to all of the
// op's threads, which wait in worker() meanwhile. So e8kv runs on llama.cpp's own threads (-t),
// with no pool of its own. Results do not depend on the thread count (e8kv's attention is
// deterministic).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "e8kv/parallel.hpp"

namespace e8kv_llama {

/// A reusable barrier for the threads of one ggml op (all of them run the op at once; ggml itself
/// waits for all of them between two ops, so no thread can be a whole op ahead).
class SpinBarrier {
 public:
  void wait(int n);

 private:
  std::atomic<int> count_{0};
  std::atomic<unsigned> generation_{0};
};

class OpGang final : public e8kv::Executor {
 public:
  // Every thread of the op passes the op's own thread count (ggml's nth): a worker may reach its
  // first barrier before thread 0 has called begin(), so nothing it waits on may depend on begin().
  void begin(int n_threads);  ///< thread 0, before any run()
  void end();                 ///< thread 0: releases the workers
  void worker(int n_threads); ///< threads 1..n-1: serve run() until end()
  int concurrency() const override { return n_threads_; }
  void run(int64_t n, const std::function<void(int64_t)>& fn) override;

 private:
  void work();
  SpinBarrier barrier_;
  int n_threads_ = 1;
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  std::mutex error_mutex_;
  std::string error_;
};

}  // namespace e8kv_llama
