// The IB CM of one model host (drivers/infiniband/core/cm.c; semantics.md A): communication IDs
// and their states, the REQ/MRA/REJ/REP/RTU/DREQ/DREP exchange as MADs on the fabric, response
// timeouts and retries as mad.c does them, TIMEWAIT, duplicate and stale-connection handling.
// Its consumer is the rdma_cm layer (cm_rdma.cc), which gets IbCmEvents through a handler, as
// cma_ib_handler does. cm_ib.cc: sending, retries, TIMEWAIT, tables; cm_ib_verbs.cc: the
// consumer's verbs; cm_ib_recv.cc: one handler per message.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/cm_msg.h"
#include "model/env.h"
#include "rdmalab/cm.h"
#include "rdmalab/error.h"

namespace rdmalab::model {

class Device;

// enum ib_cm_state (include/rdma/ib_cm.h).
enum class IbCmState {
  IDLE,
  LISTEN,
  REQ_SENT,
  REQ_RCVD,
  MRA_REQ_SENT,
  MRA_REQ_RCVD,
  REP_SENT,
  REP_RCVD,
  MRA_REP_SENT,
  MRA_REP_RCVD,
  ESTABLISHED,
  DREQ_SENT,
  DREQ_RCVD,
  TIMEWAIT,
  SIDR_REQ_SENT,
  SIDR_REQ_RCVD,
};
const char* to_string(IbCmState s);

// enum ib_cm_event_type, the subset without LAP/APR/SIDR.
enum class IbCmEventType {
  REQ_ERROR,
  REQ_RECEIVED,
  REP_ERROR,
  REP_RECEIVED,
  RTU_RECEIVED,
  USER_ESTABLISHED,
  DREQ_ERROR,
  DREQ_RECEIVED,
  DREP_RECEIVED,
  TIMEWAIT_EXIT,
  MRA_RECEIVED,
  REJ_RECEIVED,
};
const char* to_string(IbCmEventType t);

struct IbCmEvent {
  IbCmEventType type = IbCmEventType::REQ_ERROR;
  uint32_t id = 0;         // the local communication ID (REQ_RECEIVED: the new id)
  uint32_t listen_id = 0;  // REQ_RECEIVED
  int reason = 0;          // REJ_RECEIVED
  CmMsg msg;               // the message behind the event (REQ/REP fields for the consumer)
  std::string remote_host;
};

// ib_send_cm_req's parameters (struct ib_cm_req_param), as rdma_cm fills them.
struct IbCmReqParam {
  uint64_t service_id = 0;
  std::string dst_host;
  Gid dgid;
  uint32_t qpn = 0;
  uint32_t starting_psn = 0;
  uint8_t packet_life_time = 18;
  uint8_t remote_cm_response_timeout = 20;
  uint8_t local_cm_response_timeout = 20;
  uint8_t max_cm_retries = 15;
  uint8_t responder_resources = 1;
  uint8_t initiator_depth = 1;
  uint8_t retry_count = 7;
  uint8_t rnr_retry_count = 7;
  std::vector<uint8_t> private_data;
};

struct IbCmRepParam {
  uint32_t qpn = 0;
  uint32_t starting_psn = 0;
  uint8_t responder_resources = 1;
  uint8_t initiator_depth = 1;
  uint8_t rnr_retry_count = 7;
  std::vector<uint8_t> private_data;
};

class IbCm {
 public:
  using Handler = std::function<void(const IbCmEvent&)>;

  explicit IbCm(Device& dev);
  IbCm(const IbCm&) = delete;
  IbCm& operator=(const IbCm&) = delete;

  // --- the consumer's verbs (ib_create_cm_id, ib_send_cm_*); EINVAL in a wrong state
  uint32_t create_id(Handler handler);
  void set_handler(uint32_t id, Handler handler);
  // cm_destroy_id: what each state sends on the way out. err ENOMEM in REQ_RCVD (a consumer
  // out of room) drops the REQ without a REJ so the active side retries.
  void destroy_id(uint32_t id, int err = 0);
  void listen(uint32_t id, uint64_t service_id);
  void send_req(uint32_t id, const IbCmReqParam& p);
  void send_rep(uint32_t id, const IbCmRepParam& p);
  void send_rtu(uint32_t id);
  void send_mra(uint32_t id, uint8_t service_timeout, bool delay);
  void send_rej(uint32_t id, int reason, const std::vector<uint8_t>& private_data);
  void send_dreq(uint32_t id);
  void send_drep(uint32_t id);
  void notify_comm_est(uint32_t id);  // ib_cm_notify(IB_EVENT_COMM_EST) -> cm_establish
  // The device handled COMM_EST for a QP: the id bound to that QPN is told (see cm_ib.cc).
  void on_comm_est_qp(uint32_t qpn);

  bool exists(uint32_t id) const { return ids_.count(id) != 0; }
  IbCmState state(uint32_t id) const;
  uint8_t av_timeout(uint32_t id) const;  // the QP's local ACK timeout (ib_cm_init_qp_attr)
  uint64_t unexpected_count() const { return unexpected_; }

  // --- the wire and the host
  void on_mad(const CmMsg& m, const std::string& src_host);
  // Reboot: every id, table and timer is gone at once, nothing is sent; the communication IDs
  // start from a new random operand (cm.c cm.random_id_operand is drawn at module init).
  void reset();
  std::string dump() const;

 private:
  struct Pending {  // the one MAD waiting for an answer (cm_id_priv->msg, mad.c retries)
    CmMsg msg;
    int retries_left = 0;
    int64_t timeout_ms = 0;
    uint64_t timer = 0;
    int attempt = 1;
  };
  struct Id {
    uint32_t local_id = 0;
    uint32_t remote_id = 0;
    IbCmState state = IbCmState::IDLE;
    Handler handler;
    uint64_t service_id = 0;
    uint32_t local_qpn = 0;
    uint32_t remote_qpn = 0;
    uint64_t remote_ca_guid = 0;
    std::string remote_host;
    Gid remote_gid;
    int64_t timeout_ms = 0;
    uint8_t max_cm_retries = 0;
    uint8_t av_timeout = 0;       // cm_id_priv->av.timeout
    uint8_t service_timeout = 0;  // of the MRA this side announced
    std::optional<Pending> pending;
    uint64_t timewait_timer = 0;
    bool in_remote_tables = false;
  };
  using Key = std::pair<uint64_t, uint64_t>;  // (remote comm ID or QPN, CA GUID)

  // cm_ib.cc: sending, timers, tables (the verbs are in cm_ib_verbs.cc)
  Id& get(const std::string& verb, uint32_t id);
  Id* find(uint32_t local_id, std::optional<uint32_t> remote_id);
  void set_state(Id& id, IbCmState to);
  void transmit(const std::string& dst_host, CmMsg m, const std::string& object, int attempt = 1);
  void send_on(Id& id, CmMsg m);          // no answer expected (RTU, DREP, REJ, MRA)
  void send_with_retry(Id& id, CmMsg m);  // REQ, REP, DREQ: answer expected
  void arm_timer(Id& id);
  int64_t kernel_delay_ns(int64_t ms) const;
  void cancel_mad(Id& id);
  void on_mad_timeout(uint32_t local_id, uint64_t epoch);
  void process_send_error(Id& id);  // cm_process_send_error
  void enter_timewait(Id& id);      // cm_enter_timewait
  void reset_to_idle(Id& id);       // cm_reset_to_idle
  void on_timewait_expired(uint32_t local_id, uint64_t epoch);
  void insert_remote(Id& id);
  void remove_remote(Id& id);  // cm_cleanup_timewait
  void deliver(uint32_t id, IbCmEvent ev);
  void unexpected(const CmMsg& m, const Id* id, const std::string& why);
  CmMsg rej_for(const Id& id, int reason, const std::vector<uint8_t>& private_data) const;
  std::string label(uint32_t id) const;
  // cm_ib_recv.cc: one handler per message
  void on_req(const CmMsg& m, const std::string& src);
  void on_mra(const CmMsg& m);
  void on_rej(const CmMsg& m);
  void on_rep(const CmMsg& m, const std::string& src);
  void on_rtu(const CmMsg& m);
  void on_dreq(const CmMsg& m, const std::string& src);
  void on_drep(const CmMsg& m);
  void dup_req(Id& id, const CmMsg& m);  // cm_dup_req_handler
  void dup_rep(const CmMsg& m);          // cm_dup_rep_handler
  void issue_rej(const std::string& dst, const CmMsg& m, int reason, CmMsgResponse what);
  void issue_drep(const std::string& dst, const CmMsg& dreq);

  Device& dev_;
  Env& env_;
  std::map<uint32_t, std::unique_ptr<Id>> ids_;
  std::map<uint64_t, uint32_t> listeners_;  // service ID -> id
  std::map<Key, uint32_t> remote_id_table_;
  std::map<Key, uint32_t> remote_qp_table_;
  uint32_t random_operand_ = 0;
  uint32_t next_index_ = 1;
  uint64_t epoch_ = 1;  // bumped by reset: timers of the old life find nothing
  uint64_t unexpected_ = 0;
};

}  // namespace rdmalab::model
