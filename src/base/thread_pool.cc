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
#include "dvm/runtime.h"

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

// How long an idle worker spins before it blocks: long enough to catch the next launch when
// launches come in a steady stream, short when they do not. Waking a blocked worker took ~50
// us on a 2-vCPU VM, so a launch after a 100 us gap (Python between calls) found the worker
// asleep and ran mostly on the caller's thread (rmsnorm over 1M elements, 2 threads: 155 us
// back to back, 203 us after 100 us of Python). Spinning always long keeps a core busy that
// another pool may want (before DVM ran on torch's pool when torch is present, a torch matmul
// interleaved with DVM calls ran 22% slower with 200 us of spinning, 2% with 30 us). So the
// spin follows the recent gaps between launches: a gap up to kMaxAdaptiveGapUs is caught (spin
// 1.5x the typical gap), a longer one (other work in between, an idle program) gets the base
// spin.
constexpr int kWorkerSpinUs = 30;
constexpr int kMaxAdaptiveGapUs = 300;
constexpr int kCallerSpinUs = 500;

// The typical idle gap between launches: an exponential average of recent gaps, each capped
// at twice the adaptive range so that one long pause does not erase the stream's pattern.
class GapTracker {
 public:
  void launch_started() {
    const int64_t now = now_us();
    const int64_t end = last_end_us_.load(std::memory_order_relaxed);
    if (end <= 0) return;
    const int64_t gap = std::min<int64_t>(std::max<int64_t>(now - end, 0), 2 * kMaxAdaptiveGapUs);
    const int64_t avg = avg_gap_us_.load(std::memory_order_relaxed);
    avg_gap_us_.store(avg < 0 ? gap : (3 * avg + gap) / 4, std::memory_order_relaxed);
  }
  void launch_ended() { last_end_us_.store(now_us(), std::memory_order_relaxed); }
  int worker_spin_us() const {
    const int64_t avg = avg_gap_us_.load(std::memory_order_relaxed);
    if (avg < 0 || avg > kMaxAdaptiveGapUs) return kWorkerSpinUs;
    return std::max<int>(kWorkerSpinUs, static_cast<int>(avg * 3 / 2));
  }

 private:
  static int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::atomic<int64_t> last_end_us_{0};
  std::atomic<int64_t> avg_gap_us_{-1};
};

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
    gaps_.launch_started();
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
    if (!spin_while([&] { return !finished(); }, kCallerSpinUs)) {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, finished);
    }
    gaps_.launch_ended();
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
      spin_while([&] { return queued_.load(std::memory_order_acquire) == 0; },
                 gaps_.worker_spin_us());
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

  GapTracker gaps_;
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

std::atomic<ParallelBackend> g_backend{nullptr};  // dvm::set_parallel_backend

}  // namespace

int hardware_threads() {
  // Read once: glibc answers hardware_concurrency() by reading /sys/devices/system/cpu/online
  // (open, read, close) every time, and the graph executor asks on every call.
  static const int n = [] {
    const unsigned c = std::thread::hardware_concurrency();
    return c == 0 ? 1 : static_cast<int>(c);
  }();
  return n;
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
  if (ParallelBackend backend = g_backend.load(std::memory_order_acquire)) {
    backend(parts, fn);
    return;
  }
  pool().run(parts, fn);
}

}  // namespace dvm::base

namespace dvm {

void set_parallel_backend(ParallelBackend backend) {
  base::g_backend.store(backend, std::memory_order_release);
}

}  // namespace dvm
