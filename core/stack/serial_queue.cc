#include "stack/serial_queue.h"

namespace rdmalab::stack {

void SerialThreads::thread_ended() {
  {
    std::lock_guard lock(mu_);
    --live_threads;
  }
  rt_.notify_all();
}

bool SerialThreads::join(TimeNs deadline_ns) {
  rt_.notify_all();
  return rt_.wait_notified(
      [this] {
        std::lock_guard lock(mu_);
        return live_threads == 0;
      },
      deadline_ns);
}

}  // namespace rdmalab::stack
