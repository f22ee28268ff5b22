#include "base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "base/env.h"

namespace dvm::base {

namespace {

// Tasks are (job, part) pairs; a job counts its outstanding parts. The caller runs parts too,
// so a nested or concurrent parallel_for can never deadlock waiting for busy workers.
struct Job {
  const std::function<void(int)>* fn;
  std::atomic<int> next{0};
  std::atomic<int> done{0};
  std::atomic<int> active{0};  // workers inside drain() of this job
  int parts = 0;
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins while `busy()` for up to `us` microseconds; true if it became false. Waking a thread
// blocked in the kernel costs tens of microseconds, more than a mid-sized launch runs for, so
// both sides spin briefly before they block.
template <typename F>
bool spin_while(F busy, int us) {
  auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  for (int i = 0; busy(); ++i) {
    cpu_relax();
    if ((i & 255) == 255 && std::chrono::steady_clock::now() > until) return false;
  }
  return true;
}

// Workers spin only long enough to catch the next kernel of the same graph or call (gaps of a
// few microseconds): spinning longer kept a core busy that torch's OpenMP threads wanted for
// the op issued next (a torch matmul interleaved with a DVM call ran 22% slower with 200 us,
// 2% with 30 us, 2 threads each side on 2 cores).
constexpr int kWorkerSpinUs = 30;
constexpr int kCallerSpinUs = 500;

class Pool {
 public:
  Pool() {
    int n = hardware_threads() - 1;
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void run(int parts, const std::function<void(int)>& fn) {
    Job job;
    job.fn = &fn;
    job.parts = parts;
    int helpers = std::min<int>(parts - 1, static_cast<int>(workers_.size()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int i = 0; i < helpers; ++i) queue_.push_back(&job);
      queued_.fetch_add(helpers, std::memory_order_release);
    }
    if (helpers == 1) {
      cv_.notify_one();
    } else if (helpers > 1) {
      cv_.notify_all();
    }
    drain(&job);
    // Remove queued references nobody picked up, then wait for parts in flight.
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (*it == &job) {
          it = queue_.erase(it);
          queued_.fetch_sub(1, std::memory_order_relaxed);
        } else {
          ++it;
        }
      }
    }
    auto finished = [&] { return job.done.load() == job.parts && job.active.load() == 0; };
    if (spin_while([&] { return !finished(); }, kCallerSpinUs)) return;
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, finished);
  }

 private:
  static void drain(Job* job) {
    for (int p; (p = job->next.fetch_add(1)) < job->parts;) {
      (*job->fn)(p);
      job->done.fetch_add(1);
    }
  }
  void work() {
    for (;;) {
      spin_while([&] { return queued_.load(std::memory_order_acquire) == 0; }, kWorkerSpinUs);
      std::unique_lock<std::mutex> lock(mu_);
      if (!stop_ && queue_.empty()) {
        // One wake-up, then spin again. A wake-up can arrive after the caller ran every part
        // itself (waking a sleeping thread takes longer than a mid-sized launch here); going
        // straight back to sleep would make the next launch miss this worker too, and every
        // launch after it: 2-thread launches ran at 1-thread speed for as long as that lasted.
        cv_.wait(lock);
        if (!stop_ && queue_.empty()) continue;
      }
      if (stop_) return;
      Job* job = queue_.front();
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
      job->active.fetch_add(1);
      lock.unlock();
      drain(job);
      lock.lock();
      job->active.fetch_sub(1);  // under the lock: the caller may block on done_cv_
      done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job*> queue_;
  std::atomic<int> queued_{0};
  std::vector<std::thread> workers_;
  bool stop_ = false;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: workers may outlive static destructors
  return *p;
}

}  // namespace

int hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

int kernel_threads(int requested) {
  int t = requested > 0 ? requested : hardware_threads();
  if (env().num_threads > 0) t = std::min(t, env().num_threads);
  return std::max(1, t);
}

void parallel_for(int parts, const std::function<void(int)>& fn) {
  if (parts <= 0) return;
  if (parts == 1) {
    fn(0);
    return;
  }
  pool().run(parts, fn);
}

}  // namespace dvm::base
