// The async event side of one device context: a thread that reads the uverbs async fd
// (poll(2) with a timeout, ibv_get_async_event on a nonblocking fd), maps event.element back
// to the engine object through a table filled at create and emptied at destroy, and queues
// the event for get_async_event. The raw ibv event is held until the engine ack, so the
// kernel's reported/completed counters are the real ones; destroy checks them first and
// throws EBUSY at its deadline instead of entering the blocking ibv_destroy_qp.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "rdmalab/history.h"
#include "rdmalab/types.h"
#include "verbs/wake_fd.h"

namespace rdmalab::verbs {

// The verbs backend's one clock: CLOCK_MONOTONIC plus this process's offset onto the
// controller's clock (0 unless a controller set one). Runtime deadlines, event waits and
// history times all use it, so a deadline made from RealRuntime::now_ns() means the same
// instant to every wait in the process.
TimeNs monotonic_now_ns();
void set_process_clock_offset(TimeNs offset_ns);

class EventQueue {
 public:
  EventQueue(History* history, std::string host);
  ~EventQueue();  // stops the thread and acks every held event
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  // Starts reading ctx's async fd. Call once, after the context is open.
  void start(ibv_context* ctx);
  // Stops the thread and acks every event still held (ibv_close_device needs that).
  void stop();

  // The table from a verbs object to its engine identity.
  void add_object(const void* raw, ObjectKind kind, uint64_t id, uint32_t num);
  // Before ibv_destroy_*: waits until every event read for id was acked; false at the
  // deadline. On success acks the object's unread events and drops later ones at arrival.
  bool begin_destroy(const void* raw, uint64_t id, TimeNs deadline_ns);
  // begin_destroy without waiting: acks read and unread events alike (process exit).
  void force_destroy(const void* raw, uint64_t id);
  void abort_destroy(const void* raw);  // the destroy verb failed: the object lives on
  void remove_object(const void* raw, uint64_t id);
  uint64_t unacked(uint64_t id) const;

  std::optional<AsyncEvent> get(TimeNs deadline_ns);
  void interrupt();  // the get waiting now (or the next one) returns nullopt at once
  void ack(const AsyncEvent& ev);

  // For tests and the event thread: queue one ibv event as if read from the fd.
  void deliver(const ibv_async_event& raw);

 private:
  struct Entry {
    ObjectKind kind = ObjectKind::NONE;
    uint64_t id = 0;
    uint32_t num = 0;
    bool destroying = false;
  };
  struct Held {
    AsyncEvent ev;
    ibv_async_event raw{};
  };
  void loop();
  const void* element_of(const ibv_async_event& raw, ObjectKind kind) const;
  void ack_raw(ibv_async_event& raw);
  void ack_object_locked(uint64_t id, bool read_too);

  History* history_;
  std::string host_;
  ibv_context* ctx_ = nullptr;  // null in tests: acks are bookkeeping only
  WakeFd wake_;  // ends the thread's poll at stop
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool interrupted_ = false;  // under mu_

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<const void*, Entry> objects_;
  std::deque<Held> unread_;
  std::map<uint64_t, Held> read_;                      // by seq, read and not acked
  std::map<uint64_t, uint64_t> reported_, completed_;  // by object id
  uint64_t next_seq_ = 1;
};

}  // namespace rdmalab::verbs
