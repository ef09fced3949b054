#include "verbs/real_runtime.h"

#include <ctime>

#include <algorithm>
#include <chrono>
#include <exception>

#include "rdmalab/error.h"
#include "verbs/events.h"
#include "verbs/stall_meter.h"

namespace rdmalab::verbs {

RealRuntime::~RealRuntime() {
  shutdown();
}

TimeNs RealRuntime::now_ns() const {
  return monotonic_now_ns();
}

void RealRuntime::set_clock_offset(TimeNs offset_ns) {
  set_process_clock_offset(offset_ns);
}

void RealRuntime::spawn(const std::string& name, std::function<void()> body) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) throw Error("spawn", ESHUTDOWN, name + ": runtime is shutting down");
  threads_.emplace_back([this, name, body = std::move(body)] { run_body(name, body); });
}

void RealRuntime::run_body(const std::string& name, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    thread_errors_.push_back(name + ": " + e.what());
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    thread_errors_.push_back(name + ": unknown exception");
  }
}

bool RealRuntime::wait_until(const std::function<bool()>& pred, TimeNs deadline_ns) {
  return wait(pred, deadline_ns, kPollNs);
}

bool RealRuntime::wait_notified(const std::function<bool()>& pred, TimeNs deadline_ns) {
  return wait(pred, deadline_ns, notified_backstop_ns_);
}

bool RealRuntime::wait(const std::function<bool()>& pred, TimeNs deadline_ns, TimeNs recheck_ns) {
  const TimeNs start = now_ns();
  for (;;) {
    uint64_t seen = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen = generation_;
      if (stopping_) break;
    }
    // pred runs without our lock: it may take locks of its own or call notify_all.
    if (pred()) return true;
    const TimeNs slice = process_wait_slice_ns(start, deadline_ns, recheck_ns);
    if (slice == 0) break;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::nanoseconds(slice),
                 [&] { return generation_ != seen || stopping_; });
  }
  return pred();
}

void RealRuntime::notify_all() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
  }
  cv_.notify_all();
}

bool RealRuntime::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

void RealRuntime::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    ++generation_;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
}

std::vector<std::string> RealRuntime::thread_errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return thread_errors_;
}

}  // namespace rdmalab::verbs
