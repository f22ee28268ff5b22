#include "base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/env.h"
#include "dvm/runtime.h"

namespace dvm::base {

namespace {

// A job: parts [0, parts) of fn, dealt round-robin over `stride` threads: thread t (the
// caller is 0) runs parts t, t + stride, ... A posted worker learns t from its mailbox (the
// job's address tagged with t in its low bits, free by the alignment); a posting nobody took
// is run by the caller. A fixed deal, not a shared counter of parts: claiming parts one by one
// moved the counter's cache line between the threads on every part. The caller never waits
// for a busy worker, so nested and concurrent parallel_for calls cannot deadlock.
constexpr int kMaxStride = 256;
struct alignas(kMaxStride) Job {
  // A copy, not a pointer to the caller's: the worker's first read of the job then brings the
  // callable too (one cache-line transfer fewer before its first part).
  std::function<void(int)> fn;
  int parts = 0;
  int stride = 1;
  alignas(64) std::atomic<int> helpers_done{0};  // workers that ran their parts
  void run_thread(int t) const {
    for (int p = t; p < parts; p += stride) fn(p);
  }
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
    // Stored only when it changes: idle workers read it, and every store would pull the line
    // away from them (a cache-line transfer, ~180 ns between this VM's cores).
    const int64_t next = avg < 0 ? gap : (3 * avg + gap) / 4;
    if (next != avg) avg_gap_us_.store(next, std::memory_order_relaxed);
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
  alignas(64) std::atomic<int64_t> last_end_us_{0};  // the caller's alone
  alignas(64) std::atomic<int64_t> avg_gap_us_{-1};
};

}  // namespace

// Fork and join without locks: the caller posts its job into idle workers' mailboxes (a CAS
// from empty), runs its own parts, takes back each posting no worker took (a CAS back) and
// waits only for the workers that took theirs. A worker spins on its own mailbox line. The
// cost is cache-line transfers: with a mutex-guarded queue, condition variables and a shared
// counter of parts, a 2-thread launch of two 0.5-2 us parts took 1.25 us more than a part;
// this way 1.03 us (both in one process, interleaved, while a line took ~180 ns each way
// between this VM's cores; ~0.25 us either way while transfers were fast). Workers idle past
// their spin sleep on a condition variable; the caller wakes only workers that say they sleep.
class ThreadPool::Impl {
 public:
  explicit Impl(int workers) : workers_(static_cast<size_t>(std::max(0, workers))) {
    for (Worker& w : workers_) w.thread = std::thread([this, &w] { work(w); });
  }
  ~Impl() {
    stop_.store(true);
    for (Worker& w : workers_) {
      { std::lock_guard<std::mutex> lock(w.mu); }
      w.cv.notify_one();
      w.thread.join();
    }
  }

  void run(int parts, const std::function<void(int)>& fn) {
    Job job;
    job.fn = fn;
    job.parts = parts;
    job.stride = static_cast<int>(
        std::min<size_t>({static_cast<size_t>(parts), workers_.size() + 1, kMaxStride}));
    // Post thread numbers 1..stride-1 to free workers. The list is on this frame: a part may
    // itself call parallel_for.
    PostedList posted(static_cast<size_t>(job.stride));
    for (size_t i = 0; i < workers_.size() && posted.size() + 1 < job.stride; ++i) {
      Worker& w = workers_[i];
      Job* expected = nullptr;
      if (!w.mailbox.compare_exchange_strong(expected, tag(&job, posted.size() + 1))) continue;
      posted.push(&w);
      if (w.sleeping.load()) {
        { std::lock_guard<std::mutex> lock(w.mu); }
        w.cv.notify_one();
      }
    }
    gaps_.launch_started();  // after posting: off the workers' path
    job.run_thread(0);
    for (int t = posted.size() + 1; t < job.stride; ++t) job.run_thread(t);  // no free worker
    // Postings nobody took are taken back and run here; the others are waited for.
    int taken = 0;
    for (int i = 0; i < posted.size(); ++i) {
      Job* mine = tag(&job, i + 1);
      if (posted[i]->mailbox.load() == mine &&
          posted[i]->mailbox.compare_exchange_strong(mine, nullptr)) {
        posted.clear(i);
        job.run_thread(i + 1);
      } else {
        ++taken;
      }
    }
    const auto done = [&] { return job.helpers_done.load() == taken; };
    if (!spin_while([&] { return !done(); }, kCallerSpinUs)) {
      // A long part: block. The count of blocked callers is raised before the check (both
      // seq_cst), so a worker finishing after the check sees it and wakes us.
      join_waiters_.fetch_add(1);
      {
        std::unique_lock<std::mutex> lock(join_mu_);
        join_cv_.wait(lock, done);
      }
      join_waiters_.fetch_sub(1);
    }
    // The workers that ran parts leave their mailbox taken (no other caller can post there)
    // and this caller frees it after the join with a plain store, which drains from the store
    // buffer while this thread goes on; a worker freeing it would add a transfer to the join.
    for (int i = 0; i < posted.size(); ++i)
      if (posted[i] != nullptr) posted[i]->mailbox.store(nullptr, std::memory_order_release);
    gaps_.launch_ended();
  }

 private:
  // The mailbox: empty (nullptr), a posted job (tagged with the thread number), or kTaken
  // from the worker's claim until its caller frees it.
  struct alignas(64) Worker {
    std::atomic<Job*> mailbox{nullptr};
    std::atomic<bool> sleeping{false};
    std::mutex mu;
    std::condition_variable cv;
    std::thread thread;
  };
  static inline Job* const kTaken = reinterpret_cast<Job*>(uintptr_t{1});
  static Job* tag(Job* job, int t) {
    return reinterpret_cast<Job*>(reinterpret_cast<uintptr_t>(job) | static_cast<uintptr_t>(t));
  }

  // The workers one launch posted to, on the caller's stack up to 32 of them.
  class PostedList {
   public:
    explicit PostedList(size_t capacity) {
      if (capacity > kInline) heap_.resize(capacity);
      items_ = capacity > kInline ? heap_.data() : inline_;
    }
    int size() const { return n_; }
    void push(Worker* w) { items_[n_++] = w; }
    void clear(int i) { items_[i] = nullptr; }
    Worker* operator[](int i) const { return items_[i]; }

   private:
    static constexpr size_t kInline = 32;
    Worker* inline_[kInline];
    std::vector<Worker*> heap_;
    Worker** items_;
    int n_ = 0;
  };

  static bool posted(const Worker& w) {
    Job* j = w.mailbox.load();
    return j != nullptr && j != kTaken;
  }
  void work(Worker& w) {
    for (;;) {
      if (!spin_while([&] { return !posted(w) && !stop_.load(std::memory_order_relaxed); },
                      gaps_.worker_spin_us())) {
        std::unique_lock<std::mutex> lock(w.mu);
        w.sleeping.store(true);  // seq_cst with the caller's post, then a check: no lost wake-up
        w.cv.wait(lock, [&] { return posted(w) || stop_.load(); });
        w.sleeping.store(false);
      }
      if (stop_.load()) return;
      Job* tagged = w.mailbox.load(std::memory_order_acquire);
      // The job's line travels while the claim below waits for the mailbox's (a prefetch is
      // no access: harmless if the caller takes the posting back).
      __builtin_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(tagged) &
                                                       ~uintptr_t{kMaxStride - 1}));
      if (tagged == nullptr || tagged == kTaken ||
          !w.mailbox.compare_exchange_strong(tagged, kTaken, std::memory_order_acquire)) {
        continue;  // taken back by its caller
      }
      const uintptr_t bits = reinterpret_cast<uintptr_t>(tagged);
      Job* job = reinterpret_cast<Job*>(bits & ~uintptr_t{kMaxStride - 1});
      job->run_thread(static_cast<int>(bits & (kMaxStride - 1)));
      job->helpers_done.fetch_add(1);  // the last touch of the job: its caller may return
      if (join_waiters_.load() > 0) {
        { std::lock_guard<std::mutex> lock(join_mu_); }
        join_cv_.notify_all();
      }
    }
  }

  GapTracker gaps_;
  std::vector<Worker> workers_;
  std::atomic<bool> stop_{false};
  std::atomic<int> join_waiters_{0};  // callers blocked in a join
  std::mutex join_mu_;
  std::condition_variable join_cv_;
};

ThreadPool::ThreadPool(int workers) : impl_(std::make_unique<Impl>(workers)) {}
ThreadPool::~ThreadPool() = default;
void ThreadPool::run(int parts, const std::function<void(int)>& fn) {
  if (parts <= 0) return;
  if (parts == 1) return fn(0);
  impl_->run(parts, fn);
}

namespace {
ThreadPool& pool() {
  // Never destroyed: workers may outlive static destructors.
  static ThreadPool* p = new ThreadPool(hardware_threads() - 1);
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
