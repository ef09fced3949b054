// The QP: the real queue pair on the device (QpCore) and the handles a process holds (ModelQp).
// One handle per QP, except XRC TGT QPs, which every ibv_open_qp shares (semantics.md D).
// qp.cc: state machine, posting rules, flush and completions. transport.cc: the RC/UD/XRC wire
// protocol (requester and responder).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/objects.h"
#include "model/resources.h"
#include "model/transport.h"

namespace rdmalab::model {

class ModelContext;
class ModelQp;
class Device;

struct SendWqe {
  SendWr wr;
  uint64_t seq = 0;  // posting order
  bool signaled = true;
  bool psn_assigned = false;
  uint32_t psn = 0;
  bool sent = false;                    // on the wire, waiting for ACK or response
  // caps.send_completes_on_handoff: completed SUCCESS once handed to the transport; kept for
  // retransmission, never completed again (not by its ACK, an error or a flush).
  bool reported = false;
  std::optional<WcStatus> local_error;  // found at processing; completes when it is the head
  // caps.err_post kStrand (libsiw): posted outside RTS, it sits VALID in the mapped SQ and is
  // never run, flushed nor completed.
  bool stranded = false;
};

class QpCore : public std::enable_shared_from_this<QpCore> {
 public:
  QpCore(Device& dev, uint64_t id, uint32_t qpn, const QpInitAttr& init, ModelPd* pd,
         ModelCq* send_cq, ModelCq* recv_cq, ModelSrq* srq, std::shared_ptr<XrcdCore> xrcd);

  // --- qp.cc: verbs on the real QP
  void modify(const QpAttr& attr, uint32_t mask);
  QpAttr query() const;
  void post_send(const SendWr& wr);
  void post_recv(const RecvWr& wr);
  // Destroys the real QP: out of the QPN table first, pending EQEs dropped, then the QPN freed.
  void destroy();

  // --- qp.cc: what the device and faults do to it
  void set_state(QpState to, const std::string& why);
  void to_error(const std::string& why) {
    if (state != QpState::ERR) set_state(QpState::ERR, why);
  }
  void device_fatal();  // ERR with no flush completions (a dead device)
  // iWARP: the connection, not modify, gives the QP its peer (iw_cm; the provider's accept
  // and connect reply), before the provider moves it to RTS.
  void bind_peer(const Gid& dgid, uint32_t dest_qpn, uint32_t sq_psn, uint32_t rq_psn);
  void complete_send(const SendWqe& w, WcStatus status, uint32_t byte_len = 0);
  // iWARP: the connection ends with a TERMINATE (sent or received): QP to ERR, the CM told.
  void terminate(const std::string& why);
  void complete_recv(ModelCq* cq, const RecvWr& wr, WcStatus status, uint32_t byte_len,
                     const Frame* f);

  // --- transport.cc: the wire
  void on_frame(const Frame& f);
  void kick();  // ring the doorbell: process the SQ soon

  std::string label() const { return "qp:" + std::to_string(id); }
  bool uses_cq(const ModelCq* cq) const { return send_cq == cq || recv_cq == cq; }
  size_t sq_outstanding() const { return sq_.size(); }
  size_t rq_outstanding() const { return rq_.size(); }
  bool is_tgt() const { return type == QpType::XRC_RECV; }

  Device& dev;
  Env& env;
  uint64_t id;  // engine id of the creating handle (set once it exists)
  const uint32_t qpn;
  const QpType type;
  QpState state = QpState::RESET;
  QpAttr attr;
  const QpCap cap;
  const bool sq_sig_all;
  ModelPd* pd;
  ModelCq* send_cq;
  ModelCq* recv_cq;
  ModelSrq* srq;
  std::shared_ptr<XrcdCore> xrcd;
  std::vector<ModelQp*> handles;  // open_list: every handle gets each event
  bool destroyed = false;

 private:
  // qp.cc
  void enter_state(QpState from, QpState to);
  void schedule_flush();
  void flush_now();
  void flush_rq_now();  // the RQ alone (siw's move to CLOSING)
  void post_in_error();  // a WR posted in ERR or SQE: flushed or stranded (caps.err_post)
  void reset_queues();
  void check_sq_drained();
  bool can_post_send(const std::string& verb);
  bool can_post_recv(const std::string& verb);
  std::optional<WcStatus> check_local_sges(const std::vector<Sge>& sges, bool need_write) const;

  // transport.cc: requester
  void process_sq();
  void transmit(SendWqe& w);
  void on_response(const Frame& f);
  void on_rnr_nak(const Frame& f);
  bool ack_through(uint32_t psn, bool inclusive);
  void advance_head();
  void fail_head(WcStatus status, const std::string& why);
  void arm_retransmit(bool restart = false);
  bool consume_retry(const char* cause);
  void on_retransmit_timeout();
  void go_back(uint32_t psn);
  // transport.cc: responder
  void on_request(const Frame& f);
  void respond(const Frame& req, const std::string& syndrome, uint32_t psn,
               std::vector<uint8_t> data = {});
  bool execute(const Frame& f);
  bool deliver(const Frame& f, ModelSrq* use_srq, ModelCq* cq, ModelPd* rpd);
  bool has_recv(ModelSrq* use_srq) const;
  RecvWr take_recv(ModelSrq* use_srq);
  bool no_recv(const Frame& f);
  bool check_recv_sges(const std::vector<Sge>& sges, ModelPd* rpd) const;
  bool check_rkey(const Frame& f, ModelPd* rpd, uint32_t access, uint64_t len, ModelMr** out) const;
  ModelSrq* xrc_srq(uint32_t srqn) const;
  void on_ud(const Frame& f);
  void responder_error(const Frame& f, const std::string& syndrome, const std::string& why);

  std::deque<SendWqe> sq_;
  std::deque<RecvWr> rq_;
  uint64_t next_wqe_seq_ = 1;
  // requester
  uint32_t next_psn_ = 0;
  uint32_t retry_left_ = 0;
  uint32_t rnr_left_ = 0;
  uint64_t rto_timer_ = 0;
  uint64_t rnr_timer_ = 0;
  bool rnr_waiting_ = false;
  bool kick_pending_ = false;
  bool sqd_notify_ = false;
  // responder
  uint32_t epsn_ = 0;
  bool nak_seq_sent_ = false;
  bool comm_est_raised_ = false;
  // error
  bool flush_pending_ = false;
  bool flush_lost_ = false;  // the planted lost_flush_completion defect fired here (flush_now)
  bool dead_ = false;  // device fatal: nothing completes any more
};

class ModelQp final : public ModelObject<Qp>, public Owned {
 public:
  ModelQp(ModelContext& ctx, std::shared_ptr<QpCore> core, bool open_handle);
  uint32_t qp_num() const override { return core_->qpn; }
  QpType qp_type() const override { return core_->type; }
  QpState state() const override { return core_->state; }
  void modify(const QpAttr& attr, uint32_t attr_mask) override;
  QpAttr query() const override;
  void post_send(const SendWr& wr) override;
  void post_recv(const RecvWr& wr) override;
  void destroy(TimeNs deadline_ns) override;
  bool is_open_handle() const override { return open_handle_; }
  const DeviceCaps& device_caps() const override;

  Rank rank() const override { return Rank::kQp; }
  uint64_t owned_id() const override { return st_.id; }
  bool owned_live() const override { return st_.live(); }
  void release(Release why) override;

  ModelContext& ctx() const { return ctx_; }
  const std::shared_ptr<QpCore>& core() const { return core_; }

 private:
  void check_device(const std::string& verb) const;
  ModelContext& ctx_;
  std::shared_ptr<QpCore> core_;
  bool open_handle_;
};

}  // namespace rdmalab::model
