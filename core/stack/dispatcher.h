// Async event dispatch with the lifetime rules of seed 002 (mlx5_get_rsc / mana_get_qp_ref:
// a reference per event in flight, destroy removes from the table, drops the initial
// reference and waits for the last one) and seed 001 (iw_cm's per-id ordered work list:
// events of one object are handled one at a time, in arrival order; none after destroy).
//
// Threads: one event thread reads Context::get_async_event; `workers` threads run handlers.
// Handlers of one object never overlap; different objects may run in parallel. Every event
// read is acked (ibv_ack_async_event) after its handler returns or when it is dropped, so
// the backend's destroy (which waits for acks) never blocks on us.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rdmalab/history.h"
#include "rdmalab/runtime.h"
#include "rdmalab/verbs.h"

namespace rdmalab::stack {

using AsyncHandler = std::function<void(const AsyncEvent&)>;

struct DispatcherStats {
  uint64_t read = 0;                  // events read from the context
  uint64_t delivered = 0;             // handlers run to completion (object and default handlers)
  uint64_t dropped = 0;               // acked without a handler (object destroyed, or stop)
  uint64_t unaffiliated = 0;          // went to the default handler (unaffiliated or unwatched)
  uint64_t handler_errors = 0;        // handlers that threw (recorded, event still acked)
  int max_concurrent_per_object = 0;  // must stay 1
};

class AsyncDispatcher {
 public:
  AsyncDispatcher(Runtime& runtime, std::shared_ptr<Context> ctx, History* history,
                  std::string host, int workers = 2);
  ~AsyncDispatcher();  // stop(), errors swallowed
  AsyncDispatcher(const AsyncDispatcher&) = delete;
  AsyncDispatcher& operator=(const AsyncDispatcher&) = delete;

  // Spawns the event thread and the workers (Runtime::spawn). Error(EALREADY) if started.
  void start();
  // Ends the threads; events queued but not handled are acked and counted as dropped.
  // DeadlineExceeded if a handler is still running at the deadline.
  void stop(TimeNs deadline_ns);
  bool running() const;

  // Registers obj (reference count 1); its events go to handler. Error(EEXIST) if watched.
  void watch(const Object& obj, AsyncHandler handler);
  // For unaffiliated events (PORT_*, DEVICE_FATAL, ...) and events of unwatched objects.
  void set_default_handler(AsyncHandler handler);

  // Destroy with the seed 002 ordering: mark destroying, remove from the table, drop queued
  // events (acked, "event_dropped_after_destroy"), drop the initial reference, wait until no
  // handler holds one, then call the backend destroy. After return no handler for the object
  // starts. DeadlineExceeded if a handler is still running at the deadline (the object is
  // then left destroying; a later call may finish it). Backend errors propagate.
  void destroy_qp(Qp& qp, TimeNs deadline_ns);
  void destroy_srq(Srq& srq, TimeNs deadline_ns);
  void destroy_cq(Cq& cq, TimeNs deadline_ns);

  // True once at least min_count events of this type for the object were read and settled:
  // the handler returned (or the event was dropped by a destroy or stop, or had no handler),
  // so a caller may look at what its handler did; false at the deadline. On a real device
  // handlers run on worker threads: "read" alone would race with them.
  bool wait_event(uint64_t object_id, AsyncEventType type, TimeNs deadline_ns,
                  size_t min_count = 1);
  size_t count_events(uint64_t object_id, AsyncEventType type) const;
  // Events read for the object and routed to a handler, in arrival order.
  std::vector<AsyncEvent> events_for(uint64_t object_id) const;
  DispatcherStats stats() const;
  Context& context() { return *ctx_; }

 private:
  struct State;
  void destroy_object(const Object& obj, const std::function<void()>& backend_destroy,
                      TimeNs deadline_ns);

  Runtime& runtime_;
  std::shared_ptr<Context> ctx_;
  int workers_;
  std::shared_ptr<State> state_;  // shared with the threads, which may outlive a stop timeout
};

}  // namespace rdmalab::stack
