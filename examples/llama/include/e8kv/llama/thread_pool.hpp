// A small fork-join pool: run(n, fn) calls fn(task, worker) for every task in [0, n) on the
// workers and the calling thread, and returns when all are done.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace e8kv::llama {

class ThreadPool {
 public:
  /// `threads` counts the caller; 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  /// Tasks are taken dynamically (an atomic counter). The first exception thrown by fn is
  /// rethrown here after all tasks stopped. A call made from inside a task (of any pool, e.g.
  /// a KvBackend using its own pool inside Model::decode_batch) runs serially on that thread.
  void run(int64_t n_tasks, const std::function<void(int64_t task, int worker)>& fn);

 private:
  void worker_loop(int index);
  void work(int worker);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  int active_ = 0;
  const std::function<void(int64_t, int)>* job_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
  std::mutex run_mutex_;
};

}  // namespace e8kv::llama
