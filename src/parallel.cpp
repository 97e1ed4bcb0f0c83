// ThreadPool: workers pull task indices from one shared counter; the calling thread works too.
#include "e8kv/parallel.hpp"

#include <exception>

#include "detail/require.hpp"
#include "e8kv/error.hpp"

namespace e8kv {

ThreadPool::ThreadPool(int threads) {
  detail::require(threads >= 1 && threads <= 1024, "ThreadPool: threads must be in [1, 1024], got {}", threads);
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

// Takes indices until none is left; records the first exception.
void ThreadPool::drain(const std::function<void(int64_t)>& fn, uint64_t generation) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (generation_ == generation && next_ < n_) {
    const int64_t i = next_++;
    lock.unlock();
    try {
      fn(i);
    } catch (...) {
      lock.lock();
      if (!error_) error_ = std::current_exception();
      ++finished_;
      continue;
    }
    lock.lock();
    ++finished_;
  }
  if (finished_ == n_) done_.notify_all();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t)>* job = nullptr;
    uint64_t generation = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || (generation_ != seen && next_ < n_); });
      if (stop_) return;
      seen = generation = generation_;
      job = job_;
      ++busy_;
    }
    drain(*job, generation);
    std::lock_guard<std::mutex> lock(mutex_);
    if (--busy_ == 0) done_.notify_all();
  }
}

void ThreadPool::run(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    n_ = n;
    next_ = 0;
    finished_ = 0;
    error_ = nullptr;
    generation = ++generation_;
  }
  wake_.notify_all();
  drain(fn, generation);
  std::exception_ptr error;
  {
    // Every task has finished and no worker still holds a reference to fn.
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return finished_ == n_ && busy_ == 0; });
    job_ = nullptr;
    n_ = 0;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace e8kv
