// Connection management as librdmacm shows it (rdma_cm), over the IB CM (IBTA Vol 1 ch. 12,
// the kernel's cm.c) or the iWARP CM (iwcm.c), per the device's transport. semantics.md A, B
// and F hold the facts; names follow librdmacm (rdma_connect, RDMA_CM_EVENT_DISCONNECTED).
//
// Events are read from a channel (rdma_get_cm_event) and must be acked (rdma_ack_cm_event);
// destroy waits for those acks, with a deadline, and throws Error(EBUSY) at it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmalab/verbs.h"

namespace rdmalab {

// RDMA_CM_EVENT_*, same order as librdmacm's enum rdma_cm_event_type.
enum class CmEventType {
  ADDR_RESOLVED,
  ADDR_ERROR,
  ROUTE_RESOLVED,
  ROUTE_ERROR,
  CONNECT_REQUEST,
  CONNECT_RESPONSE,
  CONNECT_ERROR,
  UNREACHABLE,
  REJECTED,
  ESTABLISHED,
  DISCONNECTED,
  DEVICE_REMOVAL,
  MULTICAST_JOIN,
  MULTICAST_ERROR,
  ADDR_CHANGE,
  TIMEWAIT_EXIT,
};

std::string_view to_string(CmEventType t);
CmEventType cm_event_from_string(std::string_view s);

// IB CM REJ reasons used by the stack (IBTA table 112; include/rdma/ib_cm.h).
enum CmRejReason : int {
  REJ_TIMEOUT = 4,
  REJ_INVALID_SERVICE_ID = 8,
  REJ_STALE_CONN = 10,
  REJ_CONSUMER_DEFINED = 28,
};

struct ConnParam {
  std::vector<uint8_t> private_data;
  uint8_t responder_resources = 1;
  uint8_t initiator_depth = 1;
  uint8_t retry_count = 7;
  uint8_t rnr_retry_count = 7;
};

struct CmEvent {
  CmEventType event = CmEventType::ADDR_RESOLVED;
  // 0; a negative errno (-ETIMEDOUT on DISCONNECTED after a lost DREP, on UNREACHABLE); for
  // REJECTED on IB the REJ reason (8, 10, 28, ...), on iWARP -ECONNREFUSED/-ECONNRESET.
  int status = 0;
  uint64_t id = 0;         // engine id of the CmId the event is for (a new id on CONNECT_REQUEST)
  uint64_t listen_id = 0;  // CONNECT_REQUEST: the listening id
  std::vector<uint8_t> private_data;
  uint64_t seq = 0;  // per channel
};

// rdma_set_option(RDMA_OPTION_ID, ...): the CM timing knobs (cma.c defaults when unset).
struct CmTiming {
  uint8_t cm_response_timeout = 20;  // CMA_CM_RESPONSE_TIMEOUT: 4.096 us * 2^20 = 4.3 s
  uint8_t max_cm_retries = 15;       // CMA_MAX_CM_RETRIES
  // CMA_IBOE_PACKET_LIFETIME, 18 in Linux 6.1 cma.c (16 in older trees); opensm's default
  // packet life time on IB is 18 as well.
  uint8_t packet_life_time = 18;
};

class CmId : public Object {
 public:
  // The rdma_cm state ("IDLE", "ADDR_QUERY", "ADDR_RESOLVED", "ROUTE_QUERY", "ROUTE_RESOLVED",
  // "CONNECT", "DISCONNECT", "ADDR_BOUND", "LISTEN", "DEVICE_REMOVAL", "DESTROYING") and the
  // state of the CM protocol underneath (IB CM: "ESTABLISHED", "DREQ_SENT", "TIMEWAIT", ...;
  // iWARP CM: "CONN_SENT", "CLOSING", ...), for assertions and dumps.
  virtual std::string cm_state() const = 0;
  virtual std::string protocol_state() const = 0;

  // rdma_resolve_addr / rdma_resolve_route: asynchronous, answered by ADDR_RESOLVED (or
  // ADDR_ERROR) and ROUTE_RESOLVED (or ROUTE_ERROR) on the channel. dst names a host of the lab
  // (model) or an address (verbs); port is the rdma_cm port (the service ID's low bits).
  virtual void resolve_addr(const std::string& dst, uint16_t port, TimeNs timeout_ns) = 0;
  virtual void resolve_route(TimeNs timeout_ns) = 0;
  // rdma_bind_addr + rdma_listen.
  virtual void listen(uint16_t port, int backlog) = 0;

  // The verbs context of the id's device: valid once the address is resolved, and on ids
  // that came with CONNECT_REQUEST. Its PD/CQs serve rdma_create_qp.
  virtual std::shared_ptr<Context> context() const = 0;
  // rdma_create_qp: an RC QP bound to this id; the CM moves it through its states.
  virtual std::shared_ptr<Qp> create_qp(Pd& pd, const QpInitAttr& attr) = 0;
  virtual std::shared_ptr<Qp> qp() const = 0;

  virtual void set_timing(const CmTiming& timing) = 0;                // before connect / accept
  virtual void connect(const ConnParam& param) = 0;                   // rdma_connect
  virtual void accept(const ConnParam& param) = 0;                    // rdma_accept
  virtual void reject(const std::vector<uint8_t>& private_data) = 0;  // rdma_reject
  virtual void disconnect() = 0;                                      // rdma_disconnect
  // rdma_destroy_id: waits until every event reported for this id was acked; EBUSY at the
  // deadline (librdmacm would wait forever).
  virtual void destroy(TimeNs deadline_ns) = 0;
};

class CmEventChannel : public Object {
 public:
  virtual std::shared_ptr<CmId> create_id() = 0;  // rdma_create_id(RDMA_PS_TCP, RC)
  // rdma_get_cm_event with a deadline; nullopt at the deadline.
  virtual std::optional<CmEvent> get_event(TimeNs deadline_ns) = 0;
  // Makes the get_event waiting now (or the next one) return nullopt at once, so a reader's
  // stop or pause flag is seen without its read polling for it (the model's reads are woken
  // through Runtime::WakeOn instead).
  virtual void interrupt_get_event() {}
  virtual void ack_event(const CmEvent& ev) = 0;  // rdma_ack_cm_event
  // The id an event names (for CONNECT_REQUEST, the new passive id).
  virtual std::shared_ptr<CmId> find_id(uint64_t id_object) const = 0;
  virtual void destroy() = 0;  // rdma_destroy_event_channel: EBUSY while ids remain
};

}  // namespace rdmalab
