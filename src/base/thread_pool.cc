#include "base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace dvm::base {

namespace {

// Tasks are (job, part) pairs; a job counts its outstanding parts. The caller runs parts too,
// so a nested or concurrent parallel_for can never deadlock waiting for busy workers.
struct Job {
  const std::function<void(int)>* fn;
  std::atomic<int> next{0};
  std::atomic<int> done{0};
  int parts = 0;
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
    Job job;
    job.fn = &fn;
    job.parts = parts;
    int helpers = std::min<int>(parts - 1, static_cast<int>(workers_.size()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int i = 0; i < helpers; ++i) queue_.push_back(&job);
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
        it = (*it == &job) ? queue_.erase(it) : it + 1;
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return job.done.load() == job.parts && active_on(&job) == 0; });
  }

 private:
  static void drain(Job* job) {
    for (int p; (p = job->next.fetch_add(1)) < job->parts;) {
      (*job->fn)(p);
      job->done.fetch_add(1);
    }
  }
  int active_on(Job* job) {
    int n = 0;
    for (Job* j : running_) n += (j == job);
    return n;
  }
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      Job* job = queue_.front();
      queue_.pop_front();
      running_.push_back(job);
      lock.unlock();
      drain(job);
      lock.lock();
      running_.erase(std::find(running_.begin(), running_.end(), job));
      done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job*> queue_;
  std::vector<Job*> running_;
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

void parallel_for(int parts, const std::function<void(int)>& fn) {
  if (parts <= 0) return;
  if (parts == 1) {
    fn(0);
    return;
  }
  pool().run(parts, fn);
}

}  // namespace dvm::base
