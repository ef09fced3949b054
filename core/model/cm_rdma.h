// rdma_cm on the model (cma.c, ucma.c, librdmacm; semantics.md B): event channels and CM ids
// over the host's IB CM (cm_ib.h) or iWARP CM (cm_iw.h), chosen by the device's transport.
// cm_channel.cc: the channel (event queue, acks); cm_rdma.cc: the id verbs; cm_rdma_ib.cc and
// cm_rdma_iw.cc: the event mapping of cma_ib_handler and cma_iw_handler.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/cm_ib.h"
#include "model/objects.h"
#include "rdmalab/cm.h"

namespace rdmalab::model {

class Device;
class ModelProcess;
class ModelCmId;
class IwCm;
struct IwCmEvent;

// enum rdma_cm_state (cma_priv.h).
enum class RdmaCmState {
  IDLE,
  ADDR_QUERY,
  ADDR_RESOLVED,
  ROUTE_QUERY,
  ROUTE_RESOLVED,
  CONNECT,
  DISCONNECT,
  ADDR_BOUND,
  LISTEN,
  DEVICE_REMOVAL,
  DESTROYING,
};
const char* to_string(RdmaCmState s);

// (model) Address and route resolution answer after this long (no ARP or SA on the model).
inline constexpr TimeNs kCmResolveNs = 50 * kNsPerUs;

// RDMA_PS_TCP (rdma_cm.h): the service ID is (ps << 16) + port (cma.c rdma_get_service_id).
inline uint64_t cm_service_id(uint16_t port) {
  return (uint64_t{0x0106} << 16) + port;
}

class ModelCmEventChannel final : public ModelObject<CmEventChannel>,
                                  public std::enable_shared_from_this<ModelCmEventChannel> {
 public:
  explicit ModelCmEventChannel(ModelProcess& proc);

  std::shared_ptr<CmId> create_id() override;
  std::optional<CmEvent> get_event(TimeNs deadline_ns) override;
  void ack_event(const CmEvent& ev) override;
  std::shared_ptr<CmId> find_id(uint64_t id_object) const override;
  void destroy() override;

  // --- for the ids
  ModelProcess& proc() const { return proc_; }
  Device& dev() const;
  // Queues an event; owner is the id whose acks destroy waits for (the listener for
  // CONNECT_REQUEST, as ucma counts it on the listening context).
  void queue(const CmEvent& ev, uint64_t owner);
  std::shared_ptr<ModelCmId> adopt_passive();  // the new id of a CONNECT_REQUEST
  uint64_t unacked(uint64_t owner) const;
  size_t unread_connect_requests(uint64_t listen_id) const;
  size_t live_ids() const { return ids_.size(); }
  // rdma_destroy_id: the id's unread events go (ucma_cleanup_ctx_events); ids of unread
  // CONNECT_REQUESTs of a listener are destroyed with it.
  void forget(uint64_t id);
  // Process kill or lab shutdown: every id ends without waiting for acks.
  void release(Release why);
  std::string dump() const;

 private:
  struct Queued {
    CmEvent ev;
    uint64_t owner = 0;
  };
  struct Counts {
    uint64_t reported = 0;
    uint64_t completed = 0;
  };
  ModelProcess& proc_;
  std::map<uint64_t, std::shared_ptr<ModelCmId>> ids_;
  std::deque<Queued> queue_;
  std::map<uint64_t, uint64_t> read_unacked_;  // event seq -> owner
  std::map<uint64_t, Counts> counts_;
  uint64_t next_seq_ = 1;
};

class ModelCmId final : public ModelObject<CmId>, public std::enable_shared_from_this<ModelCmId> {
 public:
  explicit ModelCmId(ModelCmEventChannel& ch);

  std::string cm_state() const override { return to_string(state_); }
  std::string protocol_state() const override;
  void resolve_addr(const std::string& dst, uint16_t port, TimeNs timeout_ns) override;
  void resolve_route(TimeNs timeout_ns) override;
  void listen(uint16_t port, int backlog) override;
  std::shared_ptr<Context> context() const override { return ctx_; }
  std::shared_ptr<Qp> create_qp(Pd& pd, const QpInitAttr& attr) override;
  std::shared_ptr<Qp> qp() const override { return qp_; }
  void set_timing(const CmTiming& timing) override;
  void connect(const ConnParam& param) override;
  void accept(const ConnParam& param) override;
  void reject(const std::vector<uint8_t>& private_data) override;
  void disconnect() override;
  void destroy(TimeNs deadline_ns) override;

  // --- model
  // deadline_ns: rdma_destroy_id's, for an iWARP id that must wait for its connect (IwCm::
  // destroy_id); none where the caller cannot block (a kill, an unread CONNECT_REQUEST).
  void release(Release why, std::optional<TimeNs> deadline_ns = std::nullopt);
  RdmaCmState state() const { return state_; }
  bool iwarp() const;
  std::string dump() const;

 private:
  friend class ModelCmEventChannel;
  void set_state(RdmaCmState to);
  bool comp_exch(RdmaCmState from, RdmaCmState to);
  void report(CmEventType type, int status, std::vector<uint8_t> private_data = {},
              uint64_t owner = 0, uint64_t new_id = 0);
  void require(const std::string& verb, std::initializer_list<RdmaCmState> states) const;
  void bind_device();
  QpAttr rtr_attr(uint32_t dest_qpn, uint32_t rq_psn, uint8_t responder_resources) const;
  void modify_qp(QpState to, const QpAttr& attr, uint32_t mask);
  void qp_to_err();
  // cm_rdma_ib.cc: the IB side (cma_connect_ib, cma_accept_ib, cma_ib_handler, ...)
  void ib_connect();
  void ib_accept();
  void ib_disconnect();
  IbCm& ib() const;
  IbCm::Handler ib_handler();
  void on_ib_event(const IbCmEvent& ev);
  void on_ib_req(const IbCmEvent& ev);
  int ib_rep_recv(const IbCmEvent& ev);
  // cm_rdma_iw.cc: the iWARP side (cma_connect_iw, cma_accept_iw, cma_iw_handler)
  IwCm& iw() const;
  std::function<void(const IwCmEvent&)> iw_handler();
  void iw_qp_rtr();
  void on_iw_req(const IwCmEvent& ev);
  void iw_listen();
  void iw_connect();
  void iw_accept();
  void iw_reject();
  void iw_disconnect();
  void iw_destroy(std::optional<TimeNs> deadline_ns);
  void on_iw_event(const IwCmEvent& ev);

  ModelCmEventChannel& ch_;
  RdmaCmState state_ = RdmaCmState::IDLE;
  CmTiming timing_;
  ConnParam param_;
  std::shared_ptr<Context> ctx_;
  std::shared_ptr<Qp> qp_;
  std::string dst_host_;
  Gid dgid_;
  uint16_t port_ = 0;
  int backlog_ = 0;
  uint32_t psn_ = 0;
  uint32_t ib_id_ = 0;  // IB CM communication ID (0: none)
  uint32_t iw_id_ = 0;  // iWARP CM id (0: none)
  // passive side: what the REQ / MPA request said
  uint32_t peer_qpn_ = 0;
  uint32_t peer_psn_ = 0;
  uint8_t peer_retry_count_ = 7;
  uint8_t peer_rnr_retry_ = 7;
  Gid peer_gid_;
  std::string peer_host_;
  bool disconnect_called_ = false;  // rdma_disconnect on this id (the missing_disconnected defect)
};

}  // namespace rdmalab::model
