#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

#include "verbs/cm.h"
#include "verbs/context.h"

namespace rdmalab::verbs {

namespace {
int timeout_ms(TimeNs ns) {
  return static_cast<int>(std::clamp<TimeNs>(ns / kNsPerMs, 1, TimeNs{3600} * 1000));
}

void check_cm(const std::string& verb, int rc, const std::string& detail) {
  if (rc != 0) throw Error(verb, last_errno(), detail);  // librdmacm: -1 and errno
}

rdma_conn_param to_rdma(const ConnParam& p) {
  rdma_conn_param out{};
  out.private_data = p.private_data.empty() ? nullptr : p.private_data.data();
  out.private_data_len = static_cast<uint8_t>(p.private_data.size());
  out.responder_resources = p.responder_resources;
  out.initiator_depth = p.initiator_depth;
  out.retry_count = p.retry_count;
  out.rnr_retry_count = p.rnr_retry_count;
  return out;
}

using AddrInfo = std::unique_ptr<addrinfo, void (*)(addrinfo*)>;

AddrInfo resolve(const std::string& dst, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(dst.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) throw Error("getaddrinfo", EADDRNOTAVAIL, dst + ": " + gai_strerror(rc));
  return {res, freeaddrinfo};
}
}  // namespace

VerbsCmId::VerbsCmId(std::shared_ptr<VerbsCmEventChannel> ch, Handle<rdma_cm_id> id,
                     std::string state)
    : ch_(std::move(ch)),
      id_(new_object_id()),
      label_("cm_id:" + std::to_string(id_)),
      cm_(std::move(id)),
      state_(std::move(state)) {
  recorded("rdma_create_id", {{"state", state_}});
}

VerbsCmId::~VerbsCmId() {
  release();
}

void VerbsCmId::recorded(const std::string& verb, nlohmann::json data) const {
  data["verb"] = verb;
  ch_->record(label_, "verb", std::move(data));
}

std::string VerbsCmId::cm_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

void VerbsCmId::set_state(const std::string& s) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = s;
}

void VerbsCmId::on_event(CmEventType type) {
  switch (type) {
    case CmEventType::ADDR_RESOLVED:
      set_state("ADDR_RESOLVED");
      break;
    case CmEventType::ROUTE_RESOLVED:
      set_state("ROUTE_RESOLVED");
      break;
    case CmEventType::ESTABLISHED:
      set_state("CONNECT");
      break;
    case CmEventType::DISCONNECTED:
      set_state("DISCONNECT");
      break;
    case CmEventType::DEVICE_REMOVAL:
      set_state("DEVICE_REMOVAL");
      break;
    default:
      break;  // errors leave the state where the kernel's view is not known to us
  }
}

void VerbsCmId::resolve_addr(const std::string& dst, uint16_t port, TimeNs timeout_ns) {
  rdma_cm_id* id = cm_.get("rdma_resolve_addr");
  AddrInfo ai = resolve(dst, port);
  set_state("ADDR_QUERY");
  check_cm("rdma_resolve_addr", rdma_resolve_addr(id, nullptr, ai->ai_addr, timeout_ms(timeout_ns)),
           dst + ":" + std::to_string(port));
  recorded("rdma_resolve_addr", {{"dst", dst}, {"port", port}});
}

void VerbsCmId::resolve_route(TimeNs timeout_ns) {
  rdma_cm_id* id = cm_.get("rdma_resolve_route");
  set_state("ROUTE_QUERY");
  check_cm("rdma_resolve_route", rdma_resolve_route(id, timeout_ms(timeout_ns)), label_);
  recorded("rdma_resolve_route");
}

void VerbsCmId::listen(uint16_t port, int backlog) {
  rdma_cm_id* id = cm_.get("rdma_bind_addr");
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_port = htons(port);
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  check_cm("rdma_bind_addr", rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&any)),
           "port " + std::to_string(port));
  set_state("ADDR_BOUND");
  check_cm("rdma_listen", rdma_listen(id, backlog), "port " + std::to_string(port));
  set_state("LISTEN");
  recorded("rdma_listen", {{"port", port}, {"backlog", backlog}});
}

std::shared_ptr<Context> VerbsCmId::context() const {
  rdma_cm_id* id = cm_.get("rdma_cm_id.verbs");
  if (id->verbs == nullptr) throw Error("rdma_cm_id.verbs", ENODEV, label_ + ": no device yet");
  std::lock_guard<std::mutex> lock(mu_);
  if (!ctx_) ctx_ = cm_context(id->verbs, ch_->history(), ch_->host());
  return ctx_;
}

std::shared_ptr<Qp> VerbsCmId::create_qp(Pd& pd, const QpInitAttr& attr) {
  rdma_cm_id* id = cm_.get("rdma_create_qp");
  auto ctx = std::dynamic_pointer_cast<VerbsContext>(context());
  if (!ctx) throw Error("rdma_create_qp", EINVAL, label_ + " has no device yet");
  check_owner(*ctx, pd, "rdma_create_qp", "pd");  // the id's device context: its PD only
  auto* vpd = dynamic_cast<VerbsPd*>(&pd);
  if (vpd == nullptr) throw Error("rdma_create_qp", EINVAL, pd.label() + " is not a verbs object");
  QpInitAttr a = attr;
  a.qp_type = QpType::RC;
  a.pd = vpd->shared_from_this();
  auto qp = ctx->create_cm_qp(a, CmBinding{id, live_});
  std::lock_guard<std::mutex> lock(mu_);
  qp_ = qp;
  return qp;
}

std::shared_ptr<Qp> VerbsCmId::qp() const {
  std::lock_guard<std::mutex> lock(mu_);
  return qp_;
}

void VerbsCmId::set_timing(const CmTiming& timing) {
  cm_.get("rdma_set_option");
  const CmTiming defaults;
  // librdmacm has no option for the CM response timeout, retries or packet life time; the
  // kernel's cma.c defaults are all a real id can have.
  if (timing.cm_response_timeout != defaults.cm_response_timeout ||
      timing.max_cm_retries != defaults.max_cm_retries ||
      timing.packet_life_time != defaults.packet_life_time) {
    throw Error("rdma_set_option", EOPNOTSUPP, "CM timing is fixed by the kernel (cma.c)");
  }
}

void VerbsCmId::connect(const ConnParam& param) {
  rdma_cm_id* id = cm_.get("rdma_connect");
  rdma_conn_param p = to_rdma(param);
  check_cm("rdma_connect", rdma_connect(id, &p), label_);
  set_state("CONNECT");
  recorded("rdma_connect");
}

void VerbsCmId::accept(const ConnParam& param) {
  rdma_cm_id* id = cm_.get("rdma_accept");
  rdma_conn_param p = to_rdma(param);
  check_cm("rdma_accept", rdma_accept(id, &p), label_);
  recorded("rdma_accept");
}

void VerbsCmId::reject(const std::vector<uint8_t>& private_data) {
  rdma_cm_id* id = cm_.get("rdma_reject");
  check_cm("rdma_reject",
           rdma_reject(id, private_data.empty() ? nullptr : private_data.data(),
                       static_cast<uint8_t>(private_data.size())),
           label_);
  recorded("rdma_reject");
}

void VerbsCmId::disconnect() {
  rdma_cm_id* id = cm_.get("rdma_disconnect");
  check_cm("rdma_disconnect", rdma_disconnect(id), label_);
  set_state("DISCONNECT");
  recorded("rdma_disconnect");
}

void VerbsCmId::destroy(TimeNs deadline_ns) {
  cm_.get("rdma_destroy_id");
  if (!ch_->begin_destroy(id_, deadline_ns)) {
    throw Error("rdma_destroy_id", EBUSY,
                label_ + ": " + std::to_string(ch_->unacked(id_)) + " cm events not acked");
  }
  set_state("DESTROYING");
  *live_ = false;  // the QP, if any, is destroyed by ibv_destroy_qp from now on
  cm_.destroy();
  recorded("rdma_destroy_id");
}

void VerbsCmId::release() noexcept {
  if (!cm_.live()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (qp_) {
      if (auto* r = dynamic_cast<Releasable*>(qp_.get())) r->release();
    }
  }
  *live_ = false;
  cm_.reset();
}

}  // namespace rdmalab::verbs
