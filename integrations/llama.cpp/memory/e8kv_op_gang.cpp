// The op's thread gang (e8kv_op_gang.hpp).
#include "e8kv_op_gang.hpp"

#include <exception>
#include <thread>

#include "e8kv/error.hpp"

namespace e8kv_llama {

void SpinBarrier::wait(int n) {
  const unsigned generation = generation_.load(std::memory_order_acquire);
  if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
    count_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    return;
  }
  // Spin (the other threads are usually microseconds away: each has its core, as llama.cpp's own
  // threads spin between ops), then yield the core when the wait grows long (an oversubscribed host).
  for (int spins = 0; generation_.load(std::memory_order_acquire) == generation; ++spins) {
    if (spins < (1 << 14)) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
}

void OpGang::begin(int n_threads) {
  n_threads_ = n_threads < 1 ? 1 : n_threads;
  stop_.store(false, std::memory_order_relaxed);
  job_ = nullptr;
  error_.clear();
}

void OpGang::end() {
  if (n_threads_ <= 1) return;
  stop_.store(true, std::memory_order_relaxed);
  barrier_.wait(n_threads_);  // the workers see stop_ and leave the op
}

void OpGang::worker(int n_threads) {
  for (;;) {
    barrier_.wait(n_threads);  // a job (or stop) published by thread 0
    if (stop_.load(std::memory_order_relaxed)) return;
    work();
    barrier_.wait(n_threads);  // job done
  }
}

void OpGang::work() {
  for (;;) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) return;
    try {
      (*job_)(i);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (error_.empty()) error_ = e.what();
    }
  }
}

void OpGang::run(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n_threads_ <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  job_ = &fn;
  n_ = n;
  next_.store(0, std::memory_order_relaxed);
  barrier_.wait(n_threads_);
  work();
  barrier_.wait(n_threads_);
  job_ = nullptr;
  if (!error_.empty()) {
    std::string e;
    e.swap(error_);
    throw e8kv::Error(e);
  }
}

}  // namespace e8kv_llama
