// Threads the caller controls. e8kv never starts threads on its own: an engine passes an
// Executor (its own pool behind this interface, or e8kv::ThreadPool) to the calls that can use
// one, and without one everything runs on the calling thread. Results never depend on the
// executor or its thread count: work is cut into the same pieces and combined in the same
// order whatever runs them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace e8kv {

/// Runs n independent tasks, fn(0) .. fn(n − 1), and returns when all have finished. Tasks may
/// run concurrently and in any order. An exception thrown by a task is rethrown by run() after
/// every task has finished (the first one thrown wins).
class Executor {
 public:
  virtual ~Executor() = default;
  /// Threads that may run tasks at once (>= 1); a hint for how finely work is split.
  virtual int concurrency() const = 0;
  virtual void run(int64_t n, const std::function<void(int64_t)>& fn) = 0;
};

/// A fixed pool of `threads` workers, the calling thread being one of them (threads = 1 runs
/// everything inline). run() may be called from one thread at a time.
class ThreadPool final : public Executor {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int concurrency() const override { return static_cast<int>(workers_.size()) + 1; }
  void run(int64_t n, const std::function<void(int64_t)>& fn) override;

 private:
  void worker_loop();
  void drain(const std::function<void(int64_t)>& fn, uint64_t generation);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t n_ = 0, next_ = 0, finished_ = 0;
  uint64_t generation_ = 0;
  int busy_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

/// fn(0..n) on `executor`, or inline in index order when it is null.
inline void run_tasks(Executor* executor, int64_t n, const std::function<void(int64_t)>& fn) {
  if (executor == nullptr || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  executor->run(n, fn);
}

}  // namespace e8kv
