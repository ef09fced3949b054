// The connection lifecycle over rdma_cm (cm.h): an event pump that acks every CM event before
// destroy can need it, and the connect / accept steps as named sync points.
//
// CmEventPump is seed 001's per-id ordered event queue (Sean Hefty's work_list proposal, as
// iwcm.c does it today): one thread reads the channel (rdma_get_cm_event); events of one id
// are handled one at a time in arrival order, different ids in parallel on `workers` threads;
// an event is acked (rdma_ack_cm_event) when its handler returns, or at once when the id has
// no handler, so rdma_destroy_id (which waits for acks) never blocks on the pump. destroy_id
// marks the id destroying, drops its queued events (acked), waits for a running handler and
// only then calls rdma_destroy_id: no handler runs for an id after destroy_id returns.
//
// A scenario may leave events unread (pause_reading) or read and unacked (hold_acks) to test
// what rdma_destroy_id does with them.
//
// CONNECT_REQUEST carries a new id (event.id). Its handler is the new id's, else the
// listener's (rdma_cm hands the listener's context to the new id), else the default handler;
// it is queued on the new id, so the new id's later events wait for it. Destroying a listener
// waits for its CONNECT_REQUEST handlers in flight (seed 001: "destruction of the listen must
// block until we complete processing of the new request") and destroys the new ids whose
// CONNECT_REQUEST was still queued, as ucma does with requests the user never read.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmalab/cm.h"
#include "rdmalab/history.h"
#include "rdmalab/runtime.h"

namespace rdmalab::stack {

using CmHandler = std::function<void(const CmEvent&)>;

// An event as the pump read it: the event and the time it came off the channel.
struct CmEventRecord {
  CmEvent event;
  TimeNs read_ns = 0;
};

struct CmPumpStats {
  uint64_t read = 0;              // events read from the channel
  uint64_t delivered = 0;         // handlers run to completion
  uint64_t unhandled = 0;         // acked at once: no handler for the id
  uint64_t dropped = 0;           // acked without a handler run (destroying, or stop)
  uint64_t handler_errors = 0;    // handlers that threw (recorded; the event is still acked)
  int max_concurrent_per_id = 0;  // must stay 1
};

class CmEventPump {
 public:
  CmEventPump(Runtime& runtime, std::shared_ptr<CmEventChannel> channel, History* history,
              std::string host, int workers = 2);
  ~CmEventPump();  // stop(), errors swallowed
  CmEventPump(const CmEventPump&) = delete;
  CmEventPump& operator=(const CmEventPump&) = delete;

  // Spawns the event thread and the workers. Error(EALREADY) if started.
  void start();
  // Ends the threads; queued events are acked and dropped. DeadlineExceeded if a handler is
  // still running at the deadline.
  void stop(TimeNs deadline_ns);
  bool running() const;

  CmEventChannel& channel() { return *channel_; }
  const std::shared_ptr<CmEventChannel>& channel_ptr() const { return channel_; }
  Runtime& runtime() { return runtime_; }

  // Leaving events unread or unacked, to test what rdma_destroy_id or process exit does with
  // them (librdmacm: rdma_destroy_id discards the id's unread events and waits for the acks
  // of those read). pause_reading: the event thread stops calling rdma_get_cm_event on the
  // channel (a channel is one FIFO: no id can be skipped); returns once the thread is out of
  // rdma_get_cm_event (an event read meanwhile is handled as usual), DeadlineExceeded if not
  // by the deadline. resume_reading: it reads again.
  void pause_reading(TimeNs deadline_ns);
  void resume_reading();
  // hold_acks: events of the id read from now on are recorded and handled but not acked
  // (rdma_ack_cm_event), also when dropped by destroy_id, until release_acks acks them all
  // and returns how many it acked. held_acks: how many are held now.
  void hold_acks(const CmId& id);
  size_t release_acks(uint64_t id_object);
  size_t held_acks(uint64_t id_object) const;

  // The id's events go to handler from now on. Error(EEXIST) if watched, EBADF if destroyed.
  void watch(const CmId& id, CmHandler handler);
  // For events of ids with no handler of their own (nor a listener's); empty: ack at once.
  void set_default_handler(CmHandler handler);

  // Every event read for the id, in order (a CONNECT_REQUEST also under its listener).
  std::vector<CmEventRecord> events(uint64_t id_object) const;
  // The min_count-th event of this type for the id, once read (handled or not); nullopt at
  // the deadline.
  std::optional<CmEvent> wait_event(uint64_t id_object, CmEventType type, TimeNs deadline_ns,
                                    size_t min_count = 1);
  // The first event of the id at index >= from_index whose type is one of types.
  std::optional<CmEventRecord> wait_first(uint64_t id_object, const std::vector<CmEventType>& types,
                                          TimeNs deadline_ns, size_t from_index = 0);
  // The listener's next CONNECT_REQUEST not yet taken by this call (each is handed out once).
  std::optional<CmEvent> next_connect_request(uint64_t listen_id, TimeNs deadline_ns);

  // rdma_destroy_id after the pump is done with the id (see the header comment).
  // Error(EDEADLK) from the id's own handler; DeadlineExceeded if a handler is still running at
  // the deadline (the id stays destroying; a later call may finish it). Backend errors
  // (EBUSY: an event the caller read itself is unacked) propagate.
  void destroy_id(CmId& id, TimeNs deadline_ns);

  CmPumpStats stats() const;

 private:
  struct State;

  Runtime& runtime_;
  std::shared_ptr<CmEventChannel> channel_;
  int workers_;
  std::shared_ptr<State> state_;  // shared with the threads, which may outlive a stop timeout
};

// --- Lifecycle helpers (connection_steps.cc): librdmacm's connect and accept sequences over
// the pump. Every wait has the deadline and fails with DeadlineExceeded naming the step where
// the id is stuck ("active side cm_id:3 stuck in ROUTE_QUERY waiting for ROUTE_RESOLVED").

struct CmEndpointSpec {
  std::string dst;    // active side: the host (model) or address (verbs) to connect to
  uint16_t port = 0;  // the rdma_cm port (service ID)
  QpCap cap;          // of the RC QP created on the id
  int cqe = 64;       // one CQ for send and receive
  ConnParam param;
  std::optional<CmTiming> timing;             // rdma_set_option before connect / accept
  TimeNs resolve_timeout_ns = 2 * kNsPerSec;  // timeout argument of resolve_addr / route
};

// What one side of a connection owns; pd and cq live on the id's context.
struct CmConnection {
  std::shared_ptr<CmId> id;
  std::shared_ptr<Pd> pd;
  std::shared_ptr<Cq> cq;
  std::shared_ptr<Qp> qp;
};

// rdma_create_id + rdma_listen.
std::shared_ptr<CmId> cm_listen(CmEventPump& pump, uint16_t port, int backlog = 16);

// Active side up to rdma_connect: resolve_addr -> ADDR_RESOLVED -> resolve_route ->
// ROUTE_RESOLVED -> PD, CQ and QP on the id's context -> connect. Returns right after
// rdma_connect (ESTABLISHED comes later: cm_await). ADDR_ERROR / ROUTE_ERROR throw
// Error(rdma_resolve_addr / rdma_resolve_route). On any failure what was made is destroyed.
CmConnection cm_connect(CmEventPump& pump, const CmEndpointSpec& spec, TimeNs deadline_ns);

// Passive side, on the id of a CONNECT_REQUEST: PD, CQ and QP on its context (unless it has a
// QP already), timing, rdma_accept.
CmConnection cm_accept(CmEventPump& pump, std::shared_ptr<CmId> id, const CmEndpointSpec& spec);

// Waits for the id's event; DeadlineExceeded naming `side`, the id, its states and the events
// seen. A different event of `fail_on` ends the wait early with Error("rdma_get_cm_event").
CmEvent cm_await(CmEventPump& pump, CmId& id, CmEventType type, TimeNs deadline_ns,
                 const std::string& side, const std::vector<CmEventType>& fail_on = {});

// The librdmacm teardown order (rdma_destroy_ep): QP, CQ, then the id through the pump, then
// the PD. Does not disconnect: call id->disconnect() first for an orderly close.
void cm_close(CmEventPump& pump, CmConnection& conn, TimeNs deadline_ns);

// "ADDR_RESOLVED, ROUTE_RESOLVED, ..." for dumps.
std::string event_names(const std::vector<CmEventRecord>& events);

}  // namespace rdmalab::stack
