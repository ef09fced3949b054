// The iWARP CM of one model host (drivers/infiniband/core/iwcm.c; semantics.md F) with the
// provider's TCP/MPA endpoint under it (what iw_cxgb4 and siw do). On the fabric the exchange
// is packets "MPA_REQUEST", "MPA_REPLY", "TCP_FIN", "TCP_ACK" and "TCP_RST", so wire faults can
// drop a FIN. Provider events go to a per-id work list processed in order (iwcm's work_list on
// the ordered iw_cm_wq); a destroyed id drops what is still queued (IWCM_F_DROP_EVENTS).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/env.h"
#include "rdmalab/error.h"
#include "rdmalab/model.h"

namespace rdmalab::model {

class Device;
class QpCore;

// enum iw_cm_state (iw_cm.h).
enum class IwCmState { IDLE, LISTEN, CONN_RECV, CONN_SENT, ESTABLISHED, CLOSING, DESTROYING };
const char* to_string(IwCmState s);

// enum iw_cm_event_type: what the provider reports.
enum class IwCmEventType { CONNECT_REQUEST, CONNECT_REPLY, ESTABLISHED, DISCONNECT, CLOSE };
const char* to_string(IwCmEventType t);

struct IwCmEvent {
  IwCmEventType type = IwCmEventType::CONNECT_REQUEST;
  int status = 0;          // CONNECT_REPLY: 0, -ECONNREFUSED, -ECONNRESET, -ETIMEDOUT
  uint32_t id = 0;         // CONNECT_REQUEST: the new id
  uint32_t listen_id = 0;  // CONNECT_REQUEST
  std::vector<uint8_t> private_data;
  std::string remote_host;
  uint32_t remote_qpn = 0;
};

// What one TCP/MPA packet carries beyond the header a wire fault sees (Packet.opcode = kind).
struct IwWire {
  std::string kind;  // "MPA_REQUEST", "MPA_REPLY", "TCP_FIN", "TCP_ACK", "TCP_RST"
  uint32_t src_ep = 0;
  uint32_t dst_ep = 0;  // 0 in MPA_REQUEST: the listener is found by port
  uint16_t port = 0;
  bool reject = false;  // MPA_REPLY: the MPA reject bit
  uint32_t qpn = 0;
  uint32_t psn = 0;
  std::vector<uint8_t> private_data;
};

class IwCm {
 public:
  using Handler = std::function<void(const IwCmEvent&)>;

  explicit IwCm(Device& dev);
  IwCm(const IwCm&) = delete;
  IwCm& operator=(const IwCm&) = delete;

  uint32_t create_id(Handler handler);
  void set_handler(uint32_t id, Handler handler);
  void listen(uint32_t id, uint16_t port);  // EADDRINUSE when the port is taken
  // iw_cm_connect / iw_cm_accept: the QP given is bound to the connection; the provider sets
  // its peer and moves it to RTS when the connection is made.
  void connect(uint32_t id, const std::string& dst_host, uint16_t port, QpCore* qp,
               const std::vector<uint8_t>& private_data);
  void accept(uint32_t id, QpCore* qp, const std::vector<uint8_t>& private_data);
  void reject(uint32_t id, const std::vector<uint8_t>& private_data);
  // iw_cm_disconnect: first waits, as destroy does, while a connect or accept is in flight,
  // then acts on the state it ended in (EINVAL only in LISTEN).
  void disconnect(uint32_t id, bool abrupt);
  // iw_destroy_cm_id. While a connect or accept is in flight (IWCM_F_CONNECT_WAIT) it first
  // waits until the CONNECT_REPLY or ESTABLISHED event moved the id on, as destroy_cm_id does:
  // with a deadline_ns (rdma_destroy_id's), it blocks; without one (a kill, the model's own
  // clean-up: callers that cannot block) it returns and the destroy ends when the event comes.
  void destroy_id(uint32_t id, std::optional<TimeNs> deadline_ns = std::nullopt);

  IwCmState state(uint32_t id) const;
  size_t queued_events(uint32_t id) const;
  void on_wire(const IwWire& w, const std::string& src_host);
  // The QP's connection ended with a TERMINATE: the provider drops it, CLOSE(0) (Q7c).
  void terminated(QpCore* qp);
  // The user moved the QP from RTS to ERR: the provider ends its connection
  // (Personality::qp_error_aborts).
  void qp_error(QpCore* qp);
  void reset();  // reboot: every endpoint gone, nothing sent
  std::string dump() const;

 private:
  struct Ep {  // the iw_cm_id and the provider endpoint (c4iw_ep, siw_cep) under it
    uint32_t id = 0;
    IwCmState state = IwCmState::IDLE;
    bool drop_events = false;   // IWCM_F_DROP_EVENTS
    bool connect_wait = false;  // IWCM_F_CONNECT_WAIT: iw_cm_connect / iw_cm_accept in flight
    bool destroy_pending = false;  // destroyed by a caller that could not wait for connect_wait
    Handler handler;
    uint16_t port = 0;
    std::string remote_host;
    uint32_t remote_ep = 0;
    uint32_t remote_qpn = 0;
    uint32_t remote_psn = 0;
    std::shared_ptr<QpCore> qp;
    uint32_t psn = 0;
    bool connected = false;  // the provider's TCP connection is up
    bool fin_sent = false;
    bool fin_acked = false;
    bool fin_rcvd = false;
    // caps.connect_is_synchronous: the TCP handshake inside iw_cm_connect (0: under way).
    int tcp_result = 1;  // 1 = none, 0 = established, else -errno
    uint64_t timer = 0;
    std::deque<IwCmEvent> work;  // work_list
    bool work_scheduled = false;
  };

  Ep* find(uint32_t id);
  Ep& get(const std::string& verb, uint32_t id);
  void set_state(Ep& ep, IwCmState to);
  void send(Ep& ep, IwWire w);
  void transmit(const std::string& dst_host, IwWire w, const std::string& object);
  // The provider's timers run on the timer wheel (Personality::iw_mpa_*_timeout_ms,
  // caps.iw_close_timeout_s).
  void arm(Ep& ep, TimeNs timeout_ns);
  void arm_close(Ep& ep);
  // siw_connect's blocking kernel_bindconnect: SYN, retransmitted on TCP's doubling RTO, until
  // a SYN-ACK (0), an RST (-ECONNREFUSED) or tcp_syn_retries retransmissions (-ETIMEDOUT).
  int tcp_connect(uint32_t id);
  void on_syn(const IwWire& w, const std::string& src_host);
  void on_timeout(uint32_t id, uint64_t epoch);
  // siw_accept_newconn: a TCP connection accepted, its MPA request awaited
  // (Personality::iw_mpa_request_timeout_ms); when the timer runs the socket is released.
  using TcpPeer = std::pair<std::string, uint32_t>;  // the peer host and its endpoint
  void on_request_timeout(const TcpPeer& peer, uint64_t epoch);
  // provider side
  void upcall(Ep& ep, IwCmEvent ev);           // cm_event_handler: append to the work list
  void run_work(uint32_t id, uint64_t epoch);  // cm_work_handler
  void process(Ep& ep, const IwCmEvent& ev);
  void on_mpa_request(const IwWire& w, const std::string& src_host);
  void on_mpa_reply(Ep& ep, const IwWire& w);
  void on_fin(Ep& ep);
  void on_ack(Ep& ep);
  void on_rst(Ep& ep);
  void establish_qp(Ep& ep);
  void qp_to(Ep& ep, bool error);   // CLOSING (SQD) or ERR
  void closed(Ep& ep, bool abort, int status);  // the endpoint is down: QP ERR, CLOSE upcall
  void released(Ep& ep);  // siw: CLOSE(0) at once, the socket released, the QP left CLOSING
  void drop_work(Ep& ep);
  // The wait_event(connect_wait, ...) of destroy_cm_id and iw_cm_disconnect (verb); true when
  // connect_wait cleared (or the id is gone).
  bool await_connect(uint32_t id, TimeNs deadline_ns, const std::string& verb);
  TimeNs connect_bound_ns() const;
  void finish_destroy(Ep& ep);  // destroy_cm_id after the wait
  void maybe_free(uint32_t id);
  std::string label(uint32_t id) const { return "iw_cm:" + std::to_string(id); }

  Device& dev_;
  Env& env_;
  std::map<uint32_t, std::unique_ptr<Ep>> eps_;
  std::map<uint16_t, uint32_t> listeners_;
  std::map<TcpPeer, uint64_t> awaiting_request_;  // accepted TCP connections -> their timer
  uint32_t next_id_ = 1;
  uint64_t epoch_ = 1;
};

}  // namespace rdmalab::model
