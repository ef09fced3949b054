// The iWARP CM and the provider endpoint under it (semantics.md F; iwcm.c, iw_cxgb4 cm.c,
// siw_cm.c). The provider turns TCP/MPA packets into events; iwcm queues them per id and
// processes them in order (cm_work_handler); only CLOSE reaches the user on a disconnect.
#include "model/cm_iw.h"

#include <algorithm>
#include <sstream>

#include "model/device.h"
#include "model/fabric.h"
#include "model/qp.h"
#include "rdmalab/kernel_timer.h"

namespace rdmalab::model {

const char* to_string(IwCmState s) {
  static const char* const names[] = {"IDLE",        "LISTEN",  "CONN_RECV", "CONN_SENT",
                                      "ESTABLISHED", "CLOSING", "DESTROYING"};
  return names[static_cast<int>(s)];
}

const char* to_string(IwCmEventType t) {
  static const char* const names[] = {"CONNECT_REQUEST", "CONNECT_REPLY", "ESTABLISHED",
                                      "DISCONNECT", "CLOSE"};
  return names[static_cast<int>(t)];
}

IwCm::IwCm(Device& dev) : dev_(dev), env_(dev.env) {}

namespace {
IwWire wire(const char* kind) {
  IwWire w;
  w.kind = kind;
  return w;
}
}  // namespace

IwCm::Ep* IwCm::find(uint32_t id) {
  auto it = eps_.find(id);
  return it == eps_.end() ? nullptr : it->second.get();
}

IwCm::Ep& IwCm::get(const std::string& verb, uint32_t id) {
  Ep* ep = find(id);
  if (ep == nullptr) throw Error(verb, EINVAL, "no iWARP CM id " + label(id));
  return *ep;
}

IwCmState IwCm::state(uint32_t id) const {
  auto it = eps_.find(id);
  return it == eps_.end() ? IwCmState::IDLE : it->second->state;
}

size_t IwCm::queued_events(uint32_t id) const {
  auto it = eps_.find(id);
  return it == eps_.end() ? 0 : it->second->work.size();
}

void IwCm::set_state(Ep& ep, IwCmState to) {
  if (ep.state == to) return;
  env_.record_fields(dev_.host, label(ep.id), "cm_state",
                     {{"layer", "iw_cm"}, {"from", to_string(ep.state)}, {"to", to_string(to)}});
  ep.state = to;
}

// ---------------------------------------------------------------- the wire

void IwCm::transmit(const std::string& dst_host, IwWire w, const std::string& object) {
  env_.record_fields(dev_.host, object, "cm_send",
                     {{"msg", w.kind},
                      {"dst", dst_host},
                      {"src_ep", w.src_ep},
                      {"dst_ep", w.dst_ep},
                      {"qpn", w.qpn}});
  Packet pkt;
  pkt.src_host = dev_.host;
  pkt.dst_host = dst_host;
  pkt.opcode = w.kind;
  pkt.src_qpn = w.qpn;
  pkt.length = static_cast<uint32_t>(w.private_data.size());
  auto wire = std::make_shared<const IwWire>(std::move(w));
  Env* env = &env_;
  dev_.fabric.send(pkt, [env, wire](const Packet& p) {
    Device* d = env->device(p.dst_host);
    if (d != nullptr && d->iw_cm) d->iw_cm->on_wire(*wire, p.src_host);
  });
}

void IwCm::send(Ep& ep, IwWire w) {
  w.src_ep = ep.id;
  w.dst_ep = ep.remote_ep;
  transmit(ep.remote_host, std::move(w), label(ep.id));
}

void IwCm::arm(Ep& ep, TimeNs timeout_ns) {
  env_.runtime.cancel(ep.timer);
  const uint32_t id = ep.id;
  const uint64_t epoch = epoch_;
  // Kernel timers (cxgb4's ep timer, siw's MPA timer: a delayed work) run on the timer wheel.
  const TimeNs delay = kernel_timer_delay_ns(env_.runtime.now_ns(),
                                             static_cast<uint64_t>(timeout_ns / kNsPerMs),
                                             dev_.caps.kernel_hz);
  ep.timer = env_.runtime.schedule_after(delay, [this, id, epoch] { on_timeout(id, epoch); });
}

// cxgb4 c4iw_ep_disconnect: start_ep_timer, jiffies + ep_timeout_secs * HZ (Q5).
void IwCm::arm_close(Ep& ep) {
  arm(ep, static_cast<TimeNs>(dev_.caps.iw_close_timeout_s) * kNsPerSec);
}

// siw_cm_work_handler, SIW_CM_WORK_MPATIMEOUT in SIW_EPSTATE_AWAIT_MPAREQ: no MPA request on
// the accepted connection; the socket is released (sock_release: a FIN, nothing was read).
void IwCm::on_request_timeout(const TcpPeer& peer, uint64_t epoch) {
  if (epoch != epoch_ || awaiting_request_.erase(peer) == 0) return;
  env_.record_fields(dev_.host, "iw_cm", "cm_timeout",
                     {{"awaiting", "MPA_REQUEST"}, {"peer", peer.first}, {"peer_ep", peer.second}});
  IwWire fin = wire("TCP_FIN");
  fin.dst_ep = peer.second;
  transmit(peer.first, std::move(fin), "iw_cm");
}

// The provider gives up: an MPA request never answered, or a close never finished.
void IwCm::on_timeout(uint32_t id, uint64_t epoch) {
  if (epoch != epoch_) return;
  Ep* ep = find(id);
  if (ep == nullptr) return;
  ep->timer = 0;
  env_.record_fields(dev_.host, label(id), "cm_timeout", {{"connected", ep->connected}});
  if (!ep->connected) {  // connect: ETIMEDOUT, and an abort for a half-open peer
    if (!ep->remote_host.empty()) send(*ep, wire("TCP_RST"));
    IwCmEvent ev;
    ev.type = IwCmEventType::CONNECT_REPLY;
    ev.status = -ETIMEDOUT;
    upcall(*ep, ev);
    return maybe_free(id);
  }
  // cxgb4 process_timeout, CLOSING/MORIBUND: QP to ERROR, close_complete_upcall(ep,
  // -ETIMEDOUT), then c4iw_ep_disconnect(ep, 1): an abort (RST) the peer sees (Q5).
  send(*ep, wire("TCP_RST"));
  closed(*ep, false, -ETIMEDOUT);
}

void IwCm::on_wire(const IwWire& w, const std::string& src_host) {
  env_.record_fields(
      dev_.host, "iw_cm", "cm_recv",
      {{"msg", w.kind}, {"src", src_host}, {"src_ep", w.src_ep}, {"dst_ep", w.dst_ep}});
  if (w.kind == "MPA_REQUEST") return on_mpa_request(w, src_host);
  if (w.kind == "TCP_SYN") return on_syn(w, src_host);
  if (w.kind == "TCP_RST") {  // an accepted connection still awaiting its MPA request is gone
    auto pit = awaiting_request_.find({src_host, w.src_ep});
    if (pit != awaiting_request_.end()) {
      env_.runtime.cancel(pit->second);
      awaiting_request_.erase(pit);
      return;
    }
  }
  Ep* ep = find(w.dst_ep);
  if (w.dst_ep == 0) {  // an abort from a side that never learnt our endpoint
    for (auto& [id, e] : eps_) {
      if (e->remote_host == src_host && e->remote_ep == w.src_ep) ep = e.get();
    }
  }
  if (ep == nullptr || ep->remote_host != src_host ||
      (ep->remote_ep != 0 && ep->remote_ep != w.src_ep)) {
    env_.record_fields(dev_.host, "iw_cm", "cm_unexpected",
                       {{"msg", w.kind}, {"why", "no such endpoint"}});
    return;
  }
  if (w.kind == "TCP_SYN_ACK") {
    if (ep->tcp_result == 1) ep->tcp_result = 0;
    return;
  }
  if (w.kind == "MPA_REPLY") return on_mpa_reply(*ep, w);
  if (w.kind == "TCP_FIN") return on_fin(*ep);
  if (w.kind == "TCP_ACK") return on_ack(*ep);
  if (w.kind == "TCP_RST") return on_rst(*ep);
}

// ---------------------------------------------------------------- provider events

// cm_event_handler: append to the id's work list; the first one queues the work item.
void IwCm::upcall(Ep& ep, IwCmEvent ev) {
  ev.id = ev.type == IwCmEventType::CONNECT_REQUEST ? ev.id : ep.id;
  if (ep.drop_events) {
    env_.record_fields(dev_.host, label(ep.id), "iw_event_dropped",
                       {{"event", to_string(ev.type)}});
    return;
  }
  env_.record_fields(
      dev_.host, label(ep.id), "iw_event",
      {{"event", to_string(ev.type)}, {"status", ev.status}, {"queued", ep.work.size()}});
  ep.work.push_back(std::move(ev));
  if (ep.work_scheduled) return;
  ep.work_scheduled = true;
  const uint32_t id = ep.id;
  const uint64_t epoch = epoch_;
  env_.runtime.schedule_after(0, [this, id, epoch] { run_work(id, epoch); });
}

// cm_work_handler: the work list in order; an id being destroyed drops what is left.
void IwCm::run_work(uint32_t id, uint64_t epoch) {
  if (epoch != epoch_) return;
  for (;;) {
    Ep* ep = find(id);
    if (ep == nullptr) return;
    if (ep->work.empty()) {
      ep->work_scheduled = false;
      return;
    }
    IwCmEvent ev = std::move(ep->work.front());
    ep->work.pop_front();
    process(*ep, ev);
  }
}

void IwCm::process(Ep& ep, const IwCmEvent& ev) {
  if (ep.drop_events || ep.state == IwCmState::DESTROYING) {
    env_.record_fields(dev_.host, label(ep.id), "iw_event_dropped",
                       {{"event", to_string(ev.type)}});
    return;
  }
  switch (ev.type) {
    case IwCmEventType::CONNECT_REQUEST:  // cm_conn_req_handler, on the listener
      if (ep.state != IwCmState::LISTEN) return destroy_id(ev.id);
      break;
    case IwCmEventType::CONNECT_REPLY:  // cm_conn_rep_handler: clears IWCM_F_CONNECT_WAIT
      ep.connect_wait = false;
      if (ep.state != IwCmState::CONN_SENT) return;
      set_state(ep, ev.status == 0 ? IwCmState::ESTABLISHED : IwCmState::IDLE);
      break;
    case IwCmEventType::ESTABLISHED:  // cm_conn_est_handler: clears IWCM_F_CONNECT_WAIT
      ep.connect_wait = false;
      if (ep.state != IwCmState::CONN_RECV) return;
      set_state(ep, IwCmState::ESTABLISHED);
      break;
    case IwCmEventType::DISCONNECT:  // cm_disconnect_handler: no user callback
      if (ep.state == IwCmState::ESTABLISHED) set_state(ep, IwCmState::CLOSING);
      return;
    case IwCmEventType::CLOSE:  // cm_close_handler
      if (ep.state != IwCmState::ESTABLISHED && ep.state != IwCmState::CLOSING) return;
      set_state(ep, IwCmState::IDLE);
      break;
  }
  if (ep.destroy_pending) {  // the wait of a destroy that could not block ends here
    if (!ep.connect_wait) finish_destroy(ep);
    return;
  }
  if (ep.handler) {
    Handler h = ep.handler;
    h(ev);
  }
}

// A SYN: the listening socket answers SYN-ACK, a port with no listener RST (tcp_v4_send_reset).
// An accepted connection waits for its MPA request (siw_accept_newconn queues the MPA timer);
// (model) the socket is accepted at the SYN: the handshake's last ACK is not modelled.
void IwCm::on_syn(const IwWire& w, const std::string& src_host) {
  auto lit = listeners_.find(w.port);
  Ep* listener = lit == listeners_.end() ? nullptr : find(lit->second);
  const bool listening = listener != nullptr && listener->state == IwCmState::LISTEN;
  IwWire r = wire(listening ? "TCP_SYN_ACK" : "TCP_RST");
  r.dst_ep = w.src_ep;
  transmit(src_host, std::move(r), "iw_cm");
  const TcpPeer peer{src_host, w.src_ep};
  if (!listening || awaiting_request_.count(peer)) return;  // a retransmitted SYN: one socket
  const uint64_t epoch = epoch_;
  const TimeNs delay = kernel_timer_delay_ns(env_.runtime.now_ns(),
                                             dev_.pers.iw_mpa_request_timeout_ms,
                                             dev_.caps.kernel_hz);
  awaiting_request_[peer] = env_.runtime.schedule_after(
      delay, [this, peer, epoch] { on_request_timeout(peer, epoch); });
}

void IwCm::on_mpa_request(const IwWire& w, const std::string& src_host) {
  auto lit = listeners_.find(w.port);
  Ep* listener = lit == listeners_.end() ? nullptr : find(lit->second);
  bool socket = true;  // the TCP connection it came on is still open
  if (dev_.caps.connect_is_synchronous) {  // the model made the connection: on_syn
    auto pit = awaiting_request_.find({src_host, w.src_ep});
    socket = pit != awaiting_request_.end();
    if (socket) {
      env_.runtime.cancel(pit->second);
      awaiting_request_.erase(pit);
    }
  }
  if (!socket || listener == nullptr || listener->state != IwCmState::LISTEN) {
    IwWire rst = wire("TCP_RST");  // connection refused
    rst.dst_ep = w.src_ep;
    return transmit(src_host, std::move(rst), "iw_cm");
  }
  const uint32_t id = create_id(listener->handler);
  Ep& ep = *eps_.at(id);
  ep.remote_host = src_host;
  ep.remote_ep = w.src_ep;
  ep.remote_qpn = w.qpn;
  ep.remote_psn = w.psn;
  ep.port = w.port;
  ep.connected = true;
  set_state(ep, IwCmState::CONN_RECV);
  IwCmEvent ev;
  ev.type = IwCmEventType::CONNECT_REQUEST;
  ev.id = id;
  ev.listen_id = listener->id;
  ev.private_data = w.private_data;
  ev.remote_host = src_host;
  ev.remote_qpn = w.qpn;
  upcall(*listener, ev);
}

void IwCm::on_mpa_reply(Ep& ep, const IwWire& w) {
  if (ep.state != IwCmState::CONN_SENT || ep.connected) {
    env_.record_fields(dev_.host, label(ep.id), "cm_unexpected", {{"msg", w.kind}});
    return;
  }
  env_.runtime.cancel(ep.timer);
  ep.timer = 0;
  ep.remote_ep = w.src_ep;
  IwCmEvent ev;
  ev.type = IwCmEventType::CONNECT_REPLY;
  ev.private_data = w.private_data;
  if (w.reject) {
    ev.status = dev_.pers.mpa_reject_status;  // the provider's (Personality::mpa_reject_status)
  } else {
    ep.connected = true;
    ep.remote_qpn = w.qpn;
    ep.remote_psn = w.psn;
    establish_qp(ep);
  }
  upcall(ep, ev);
}

// The peer closes: the provider moves the QP to CLOSING, tells iwcm (DISCONNECT), and closes
// its own half at once; when both FINs are acknowledged the endpoint is down (CLOSE).
void IwCm::on_fin(Ep& ep) {
  if (!ep.connected && ep.state == IwCmState::CONN_SENT && ep.timer != 0) {
    // siw SIW_CM_WORK_PEER_CLOSE in SIW_EPSTATE_AWAIT_MPAREP: "MPA reply not received, but
    // connection drop": CONNECT_REPLY -ECONNRESET, the endpoint released.
    env_.runtime.cancel(ep.timer);
    ep.timer = 0;
    IwCmEvent ev;
    ev.type = IwCmEventType::CONNECT_REPLY;
    ev.status = -ECONNRESET;
    upcall(ep, ev);
    return maybe_free(ep.id);
  }
  if (!ep.connected || ep.fin_rcvd) return;
  ep.fin_rcvd = true;
  if (ep.fin_sent) {  // their FIN acknowledges ours
    ep.fin_acked = true;
    send(ep, wire("TCP_ACK"));
    return closed(ep, false, 0);
  }
  IwCmEvent ev;
  ev.type = IwCmEventType::DISCONNECT;
  if (dev_.caps.iw_close_timeout_s == 0) {
    // siw SIW_CM_WORK_PEER_CLOSE (Q5): DISCONNECT and CLOSE(0) at once; the release path's
    // siw_qp_llp_close moves the QP to ERROR; the released socket sends its FIN.
    upcall(ep, ev);
    ep.fin_sent = true;
    send(ep, wire("TCP_FIN"));
    return closed(ep, false, 0);
  }
  qp_to(ep, false);
  upcall(ep, ev);
  ep.fin_sent = true;
  send(ep, wire("TCP_FIN"));
  arm_close(ep);
}

void IwCm::on_ack(Ep& ep) {
  if (!ep.connected || !ep.fin_sent) return;
  ep.fin_acked = true;
  if (ep.fin_rcvd) closed(ep, false, 0);
}

void IwCm::on_rst(Ep& ep) {
  const bool mpa_sent = ep.timer != 0;  // the MPA timer runs from the request on
  env_.runtime.cancel(ep.timer);
  ep.timer = 0;
  const bool sync = dev_.caps.connect_is_synchronous;
  if (ep.tcp_result == 1 && !ep.connected && ep.state == IwCmState::CONN_SENT && sync &&
      !mpa_sent) {
    ep.tcp_result = -ECONNREFUSED;  // the SYN met no listener: the connect() fails
    return;
  }
  if (!ep.connected) {  // our MPA request met no listener
    if (ep.state != IwCmState::CONN_SENT) return;
    IwCmEvent ev;
    ev.type = IwCmEventType::CONNECT_REPLY;
    // siw: the TCP connection was made, its reset is SIW_CM_WORK_PEER_CLOSE in
    // SIW_EPSTATE_AWAIT_MPAREP: -ECONNRESET; cxgb4: the RST to its request, -ECONNREFUSED.
    ev.status = sync ? -ECONNRESET : -ECONNREFUSED;
    upcall(ep, ev);
    return maybe_free(ep.id);
  }
  closed(ep, true, dev_.pers.abort_close_status);
}

// The connection is made: the QP gets its peer from it and goes to RTS.
void IwCm::establish_qp(Ep& ep) {
  if (!ep.qp || ep.qp->destroyed) return;
  Device* peer = env_.device(ep.remote_host);
  ep.qp->bind_peer(peer ? peer->gid : Gid{}, ep.remote_qpn, ep.psn, ep.remote_psn);
  if (ep.qp->state == QpState::RTR) ep.qp->set_state(QpState::RTS, "iw_cm: connection established");
}

// Graceful: SQD, the iWARP CLOSING state (to ERR with SQ WRs outstanding, seed 000). Abrupt: ERR.
void IwCm::qp_to(Ep& ep, bool error) {
  if (!ep.qp || ep.qp->destroyed) return;
  if (error) return ep.qp->to_error("iw_cm: connection closed");
  if (ep.qp->state == QpState::RTS) ep.qp->set_state(QpState::SQD, "iw_cm: graceful close");
}

// The endpoint is down: the provider moves the QP to ERR, then CLOSE with status (an abort:
// Personality::abort_close_status, cxgb4's -ECONNRESET, siw's 0; -ETIMEDOUT from cxgb4's ep
// timer).
void IwCm::closed(Ep& ep, bool abort, int status) {
  env_.runtime.cancel(ep.timer);
  ep.timer = 0;
  ep.connected = false;
  qp_to(ep, true);
  env_.record_fields(dev_.host, label(ep.id), "iw_closed", {{"abort", abort}, {"status", status}});
  IwCmEvent ev;
  ev.type = IwCmEventType::CLOSE;
  ev.status = status;
  upcall(ep, ev);
  maybe_free(ep.id);
}

// siw_qp_cm_drop(qp, 0) in RDMA_MODE (Q5): IW_CM_EVENT_CLOSE(0) now, then
// siw_destroy_cep_sock; TCP retransmits the FIN of the orphaned socket on its own and siw
// hears nothing more. The QP stays CLOSING until the user moves it to ERROR.
void IwCm::released(Ep& ep) {
  env_.runtime.cancel(ep.timer);
  ep.timer = 0;
  ep.connected = false;
  env_.record_fields(dev_.host, label(ep.id), "iw_closed",
                     {{"abort", false}, {"status", 0}, {"released", true}});
  IwCmEvent ev;
  ev.type = IwCmEventType::CLOSE;
  upcall(ep, ev);
  maybe_free(ep.id);
}

void IwCm::terminated(QpCore* qp) {
  for (auto& [id, ep] : eps_) {
    if (ep->qp.get() == qp && ep->connected) {
      env_.record_fields(dev_.host, label(id), "iw_terminate", {{"qpn", qp->qpn}});
      return closed(*ep, false, 0);
    }
  }
}

void IwCm::qp_error(QpCore* qp) {
  for (auto& [id, ep] : eps_) {
    if (ep->qp.get() != qp || !ep->connected || ep->state != IwCmState::ESTABLISHED) continue;
    set_state(*ep, IwCmState::CLOSING);
    if (dev_.pers.qp_error_aborts) {
      send(*ep, wire("TCP_RST"));
      return closed(*ep, true, dev_.pers.abort_close_status);
    }
    ep->fin_sent = true;  // siw_qp_cm_drop(qp, 0): CLOSE(0) now, the socket released
    send(*ep, wire("TCP_FIN"));
    return released(*ep);
  }
}

// A destroyed id stays until its endpoint is down (the provider still answers FINs).
void IwCm::maybe_free(uint32_t id) {
  Ep* ep = find(id);
  if (ep == nullptr || ep->state != IwCmState::DESTROYING || ep->connected) return;
  env_.runtime.cancel(ep->timer);
  eps_.erase(id);
}

void IwCm::drop_work(Ep& ep) {
  for (const IwCmEvent& ev : ep.work) {
    env_.record_fields(dev_.host, label(ep.id), "iw_event_dropped",
                       {{"event", to_string(ev.type)}});
  }
  ep.work.clear();
}

// ---------------------------------------------------------------- the consumer's verbs

uint32_t IwCm::create_id(Handler handler) {
  auto ep = std::make_unique<Ep>();
  ep->id = next_id_++;
  ep->handler = std::move(handler);
  ep->psn = static_cast<uint32_t>(env_.runtime.rng().next() & 0xffffff);
  const uint32_t id = ep->id;
  eps_[id] = std::move(ep);
  env_.record_fields(dev_.host, label(id), "cm_create", {{"layer", "iw_cm"}});
  return id;
}

void IwCm::set_handler(uint32_t id, Handler handler) {
  get("iw_cm_set_handler", id).handler = std::move(handler);
}

void IwCm::listen(uint32_t id, uint16_t port) {
  Ep& ep = get("iw_cm_listen", id);
  if (ep.state != IwCmState::IDLE) throw Error("iw_cm_listen", EINVAL, "not IDLE");
  if (listeners_.count(port)) throw Error("iw_cm_listen", EADDRINUSE, "port in use");
  ep.port = port;
  listeners_[port] = id;
  set_state(ep, IwCmState::LISTEN);
}

void IwCm::connect(uint32_t id, const std::string& dst_host, uint16_t port, QpCore* qp,
                   const std::vector<uint8_t>& private_data) {
  Ep& ep = get("iw_cm_connect", id);
  if (ep.state != IwCmState::IDLE) throw Error("iw_cm_connect", EINVAL, "not IDLE");
  ep.qp = qp ? qp->shared_from_this() : nullptr;
  ep.remote_host = dst_host;
  ep.port = port;
  set_state(ep, IwCmState::CONN_SENT);
  ep.connect_wait = true;
  if (dev_.caps.connect_is_synchronous) {
    const int rv = tcp_connect(id);
    Ep* again = find(id);
    if (rv != 0) {  // iw_cm_connect fails: IDLE; cma_connect_iw destroys the iw id
      if (again) {
        again->qp.reset();
        again->connect_wait = false;
        set_state(*again, IwCmState::IDLE);
      }
      throw Error("iw_cm_connect", -rv, rv == -ETIMEDOUT
                                            ? "no SYN-ACK after the SYN retries (tcp_write_timeout)"
                                            : "the peer answered the SYN with RST");
    }
    if (!again) throw Error("iw_cm_connect", ECONNABORTED, "the id went during the connect");
  }
  IwWire w = wire("MPA_REQUEST");
  w.port = port;
  w.qpn = qp ? qp->qpn : 0;
  w.psn = ep.psn;
  w.private_data = private_data;
  send(ep, std::move(w));
  arm(ep, static_cast<TimeNs>(dev_.pers.iw_mpa_reply_timeout_ms) * kNsPerMs);
}

// 6.1 tcp_write_timeout: SYN at 0 and retransmissions after TCP_TIMEOUT_INIT (1 s) doubling;
// after tcp_syn_retries retransmissions and the last RTO the connect fails with ETIMEDOUT:
// (2^(n+1) - 1) s, 127 s at 6 (Q6). The caller blocks (no O_NONBLOCK, no sk_sndtimeo).
int IwCm::tcp_connect(uint32_t id) {
  Ep* ep = find(id);
  ep->tcp_result = 1;
  uint64_t rto_ms = 1000;  // TCP_TIMEOUT_INIT: HZ jiffies
  for (int attempt = 0;; ++attempt) {
    IwWire syn = wire("TCP_SYN");
    syn.port = ep->port;
    send(*ep, std::move(syn));
    // The retransmit timer runs on the timer wheel: each RTO ends at its bucket's end.
    const TimeNs now = env_.runtime.now_ns();
    env_.runtime.wait_until(
        [this, id] {
          Ep* e = find(id);
          return e == nullptr || e->tcp_result != 1;
        },
        now + kernel_timer_delay_ns(now, rto_ms, dev_.caps.kernel_hz));
    ep = find(id);
    if (ep == nullptr) return -ECONNABORTED;
    if (ep->tcp_result != 1) break;
    if (attempt >= dev_.caps.tcp_syn_retries) {
      ep->tcp_result = -ETIMEDOUT;
      break;
    }
    env_.record_fields(dev_.host, label(id), "cm_retry",
                       {{"msg", "TCP_SYN"}, {"attempt", attempt + 1}});
    rto_ms *= 2;
  }
  const int rv = ep->tcp_result;
  ep->tcp_result = 1;
  return rv;
}

void IwCm::accept(uint32_t id, QpCore* qp, const std::vector<uint8_t>& private_data) {
  Ep& ep = get("iw_cm_accept", id);
  if (ep.state != IwCmState::CONN_RECV) throw Error("iw_cm_accept", EINVAL, to_string(ep.state));
  if (!ep.connected) throw Error("iw_cm_accept", ECONNRESET, "the peer aborted");
  ep.qp = qp ? qp->shared_from_this() : nullptr;
  ep.connect_wait = true;  // until the provider's ESTABLISHED is processed
  establish_qp(ep);
  IwWire w = wire("MPA_REPLY");
  w.qpn = qp ? qp->qpn : 0;
  w.psn = ep.psn;
  w.private_data = private_data;
  send(ep, std::move(w));
  IwCmEvent ev;  // the provider reports ESTABLISHED once its MPA reply is out
  ev.type = IwCmEventType::ESTABLISHED;
  upcall(ep, ev);
}

void IwCm::reject(uint32_t id, const std::vector<uint8_t>& private_data) {
  Ep& ep = get("iw_cm_reject", id);
  if (ep.state != IwCmState::CONN_RECV) throw Error("iw_cm_reject", EINVAL, to_string(ep.state));
  set_state(ep, IwCmState::IDLE);
  if (ep.connected) {
    IwWire w = wire("MPA_REPLY");
    w.reject = true;
    w.private_data = private_data;
    send(ep, std::move(w));
    ep.connected = false;
  }
}

// iw_cm_disconnect (iwcm.c, the same in 6.1.192 and 7.2.13): wait_event(connect_wait,
// !IWCM_F_CONNECT_WAIT), with no deadline, so a connect or accept in flight ends first
// (CONN_SENT -> ESTABLISHED or IDLE, CONN_RECV -> ESTABLISHED); then ESTABLISHED -> CLOSING and
// the QP to SQD (graceful) or ERR (abrupt), which makes the provider send a FIN or an RST;
// ESTABLISHED without a QP: CLOSING and -EINVAL; LISTEN: -EINVAL; CLOSING, IDLE and CONN_RECV
// (not accepted): nothing, 0; CONN_SENT (the wait failed) and anything else: BUG().
void IwCm::disconnect(uint32_t id, bool abrupt) {
  if (get("iw_cm_disconnect", id).connect_wait) {
    // The kernel waits as long as it takes; the model's bound is the provider's own.
    await_connect(id, env_.runtime.now_ns(), "iw_cm_disconnect");
  }
  Ep* found = find(id);
  if (found == nullptr) return;  // a reboot ended it meanwhile
  Ep& ep = *found;
  switch (ep.state) {
    case IwCmState::ESTABLISHED:
      set_state(ep, IwCmState::CLOSING);
      if (!ep.qp) throw Error("iw_cm_disconnect", EINVAL, label(id) + " has no QP");
      break;
    case IwCmState::LISTEN:
      throw Error("iw_cm_disconnect", EINVAL, to_string(ep.state));
    case IwCmState::CLOSING:
    case IwCmState::IDLE:
    case IwCmState::CONN_RECV:
      return;
    default:
      throw Error("iw_cm_disconnect", EINVAL,
                  label(id) + " in " + to_string(ep.state) + ": iw_cm_disconnect BUG()s there");
  }
  qp_to(ep, abrupt);
  if (!ep.connected) return;
  if (abrupt) {
    send(ep, wire("TCP_RST"));
    return closed(ep, true, dev_.pers.abort_close_status);
  }
  if (ep.fin_sent) return;
  ep.fin_sent = true;
  send(ep, wire("TCP_FIN"));
  if (dev_.caps.iw_close_timeout_s == 0) return released(ep);
  arm_close(ep);
}

// iw_destroy_cm_id (iwcm.c destroy_cm_id, the same in 6.1.192 and 7.2.13): first
// wait_event(connect_wait, !IWCM_F_CONNECT_WAIT), set by iw_cm_connect and iw_cm_accept and
// cleared by cm_conn_rep_handler / cm_conn_est_handler, so the id is never destroyed in
// CONN_SENT (destroy_cm_id BUG()s there): CONN_SENT -> ESTABLISHED or IDLE -> DESTROYING.
void IwCm::destroy_id(uint32_t id, std::optional<TimeNs> deadline_ns) {
  Ep* ep = find(id);
  if (ep == nullptr || ep->destroy_pending || ep->state == IwCmState::DESTROYING) return;
  if (ep->connect_wait && deadline_ns) await_connect(id, *deadline_ns, "iw_destroy_cm_id");
  ep = find(id);  // a reboot or a kill may have ended it meanwhile
  if (ep == nullptr || ep->destroy_pending || ep->state == IwCmState::DESTROYING) return;
  if (ep->connect_wait) {
    // The caller cannot block (the model runs a kill inline; the kernel would block the
    // exiting task's ucma_close here): the destroy ends when the event is processed, with the
    // same states, and no callback reaches the caller meanwhile.
    ep->destroy_pending = true;
    ep->handler = nullptr;
    env_.record_fields(dev_.host, label(id), "cm_destroy_deferred",
                       {{"layer", "iw_cm"}, {"state", to_string(ep->state)}});
    return;
  }
  finish_destroy(*ep);
}

// The provider always ends a connect: the synchronous TCP connect's SYN retries
// ((2^(n+1) - 1) s), then the MPA timer (Personality::iw_mpa_reply_timeout_ms, rounded up on
// the timer wheel by less than itself).
TimeNs IwCm::connect_bound_ns() const {
  const TimeNs syn_s = (TimeNs{2} << dev_.caps.tcp_syn_retries) - 1;
  const TimeNs mpa_ns = static_cast<TimeNs>(dev_.pers.iw_mpa_reply_timeout_ms) * kNsPerMs;
  return syn_s * kNsPerSec + 2 * mpa_ns;
}

// The wait ends when the CONNECT_REPLY (MPA reply, reject, RST or the MPA timer) or the
// accept's ESTABLISHED is processed. Its deadline is the later of the caller's and the
// provider's bound: on a device rdma_destroy_id cannot return before connect_wait clears (up
// to the MPA timeout), so a model that returned at an earlier caller's deadline would predict
// what no device does. Past both (a model defect: nothing ends the connect) it records `hung`
// with the dump, which the bounded checker reports, and the destroy is left pending.
bool IwCm::await_connect(uint32_t id, TimeNs deadline_ns, const std::string& verb) {
  const TimeNs start = env_.runtime.now_ns();
  const TimeNs bound = std::max(deadline_ns, start + connect_bound_ns());
  env_.record_fields(dev_.host, label(id),
                     verb == "iw_cm_disconnect" ? "cm_disconnect_wait" : "cm_destroy_wait",
                     {{"layer", "iw_cm"}, {"state", to_string(find(id)->state)}});
  const bool done = env_.runtime.wait_until(
      [this, id] {
        const Ep* e = find(id);
        return e == nullptr || !e->connect_wait;
      },
      bound);
  if (!done && env_.runtime.now_ns() >= bound && !env_.runtime.stopping()) {
    env_.record_fields(
        dev_.host, label(id), "hung",
        {{"what", verb + ": connect_wait never cleared on " + label(id)}, {"dump", dump()}});
  }
  return done;
}

void IwCm::finish_destroy(Ep& ep) {
  const uint32_t id = ep.id;
  const IwCmState was = ep.state;
  if (was == IwCmState::CONN_SENT || was == IwCmState::DESTROYING) {
    throw Error("iw_destroy_cm_id", EINVAL,
                label(id) + " in " + to_string(was) + ": destroy_cm_id BUG()s there");
  }
  set_state(ep, IwCmState::DESTROYING);
  ep.destroy_pending = false;
  ep.drop_events = true;
  ep.handler = nullptr;
  drop_work(ep);
  switch (was) {
    case IwCmState::LISTEN:
      listeners_.erase(ep.port);
      break;
    case IwCmState::CONN_RECV:  // reject on the caller's behalf
      if (ep.connected) {
        IwWire w = wire("MPA_REPLY");
        w.reject = true;
        send(ep, std::move(w));
      }
      ep.connected = false;
      break;
    case IwCmState::ESTABLISHED:  // abrupt: QP to ERR, the provider resets the connection
      qp_to(ep, true);
      if (ep.connected) send(ep, wire("TCP_RST"));
      ep.connected = false;
      break;
    default:  // CLOSING: the provider finishes the close; IDLE: nothing
      break;
  }
  env_.record_fields(dev_.host, label(id), "cm_destroy",
                     {{"layer", "iw_cm"}, {"state", to_string(was)}});
  maybe_free(id);
}

void IwCm::reset() {
  for (auto& [id, ep] : eps_) env_.runtime.cancel(ep->timer);
  for (auto& [peer, timer] : awaiting_request_) env_.runtime.cancel(timer);
  awaiting_request_.clear();
  env_.record_fields(dev_.host, "iw_cm", "cm_reset", {{"ids_lost", eps_.size()}});
  eps_.clear();
  listeners_.clear();
  ++epoch_;
}

std::string IwCm::dump() const {
  std::ostringstream out;
  for (const auto& [id, ep] : eps_) {
    out << "    " << label(id) << " " << to_string(ep->state) << (ep->connected ? " connected" : "")
        << (ep->connect_wait ? " connect_wait" : "")
        << (ep->destroy_pending ? " destroy_pending" : "")
        << (ep->fin_sent ? " fin_sent" : "") << (ep->fin_rcvd ? " fin_rcvd" : "") << " work "
        << ep->work.size();
    if (!ep->remote_host.empty()) out << " peer " << ep->remote_host << " qpn " << ep->remote_qpn;
    out << "\n";
  }
  return out.str();
}

}  // namespace rdmalab::model
