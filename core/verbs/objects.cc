#include "verbs/objects.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "verbs/convert.h"

namespace rdmalab::verbs {

uint64_t new_object_id() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

namespace {
// Runs the ack-aware destroy protocol of events.h around destroy_fn.
template <class Fn>
void destroy_with_acks(EventQueue& q, const void* raw, uint64_t id, const std::string& verb,
                       const std::string& label, TimeNs deadline_ns, Fn destroy_fn) {
  if (!q.begin_destroy(raw, id, deadline_ns)) {
    throw Error(verb, EBUSY,
                label + ": " + std::to_string(q.unacked(id)) + " async events read and not acked");
  }
  try {
    destroy_fn();
  } catch (...) {
    q.abort_destroy(raw);
    throw;
  }
  q.remove_object(raw, id);
}
}  // namespace

// --- PD
VerbsPd::VerbsPd(std::shared_ptr<ContextState> st) : VerbsObject(std::move(st), "pd") {
  pd_ = alloc_pd(st_->ctx.get("ibv_alloc_pd"));
}

void VerbsPd::dealloc() {
  pd_.destroy();
  recorded("ibv_dealloc_pd");
}

void VerbsPd::release() noexcept {
  if (pd_.live()) pd_.reset();
}

// --- MR
VerbsMr::VerbsMr(std::shared_ptr<ContextState> st, std::shared_ptr<VerbsPd> pd, uint64_t length,
                 uint32_t access)
    : VerbsObject(std::move(st), "mr"),
      pd_(std::move(pd)),
      mr_(pd_->get("ibv_reg_mr"), length, static_cast<int>(access)) {}

uint64_t VerbsMr::addr() const {
  mr_.get("ibv_mr.addr");
  return reinterpret_cast<uint64_t>(mr_.data());
}

std::vector<uint8_t> VerbsMr::read(uint64_t offset, uint64_t len) const {
  mr_.get("mr.read");
  if (offset > mr_.length() || len > mr_.length() - offset) {
    throw Error("mr.read", EINVAL, label_ + ": range past the end");
  }
  return {mr_.data() + offset, mr_.data() + offset + len};
}

void VerbsMr::write(uint64_t offset, const std::vector<uint8_t>& bytes) {
  mr_.get("mr.write");
  if (offset > mr_.length() || bytes.size() > mr_.length() - offset) {
    throw Error("mr.write", EINVAL, label_ + ": range past the end");
  }
  std::memcpy(mr_.data() + offset, bytes.data(), bytes.size());
}

void VerbsMr::dereg() {
  mr_.dereg();
  recorded("ibv_dereg_mr");
}

void VerbsMr::release() noexcept {
  try {
    if (mr_.live()) mr_.dereg();
  } catch (const Error&) {
  }
}

// --- CQ
VerbsCq::VerbsCq(std::shared_ptr<ContextState> st, int cqe) : VerbsObject(std::move(st), "cq") {
  cq_ = create_cq(st_->ctx.get("ibv_create_cq"), cqe);
  st_->events.add_object(cq_.raw(), ObjectKind::CQ, id_, 0);
}

std::vector<WorkCompletion> VerbsCq::poll(int max) {
  ibv_cq* cq = cq_.get("ibv_poll_cq");
  // One buffer per polling thread, not one allocation per poll (the data path; an empty poll
  // is the common case).
  thread_local std::vector<ibv_wc> wcs;
  if (wcs.size() < static_cast<size_t>(std::max(max, 0))) wcs.resize(static_cast<size_t>(max));
  const int n = max > 0 ? ibv_poll_cq(cq, max, wcs.data()) : 0;
  if (n < 0) throw Error("ibv_poll_cq", n == -1 ? last_errno() : -n, label_);
  std::vector<WorkCompletion> out;
  out.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const WorkCompletion& wc = out.emplace_back(from_ibv(wcs[static_cast<size_t>(i)]));
    if (st_->history == nullptr) continue;
    nlohmann::json data(nlohmann::json::value_t::object);  // key by key: no initializer copies
    data["wr_id"] = wc.wr_id;
    data["status"] = to_string(wc.status);
    data["opcode"] = to_string(wc.opcode);
    data["qp_num"] = wc.qp_num;
    data["byte_len"] = wc.byte_len;
    data["vendor_err"] = wc.vendor_err;
    data["cq"] = label_;
    st_->record(st_->qp_label(wc.qp_num, label_), "wc", std::move(data));
  }
  return out;
}

void VerbsCq::destroy(TimeNs deadline_ns) {
  const void* raw = cq_.get("ibv_destroy_cq");
  destroy_with_acks(st_->events, raw, id_, "ibv_destroy_cq", label_, deadline_ns,
                    [this] { cq_.destroy(); });
  recorded("ibv_destroy_cq");
}

void VerbsCq::release() noexcept {
  if (!cq_.live()) return;
  st_->events.force_destroy(cq_.raw(), id_);
  st_->events.remove_object(cq_.raw(), id_);
  cq_.reset();
}

// --- XRCD
VerbsXrcd::VerbsXrcd(std::shared_ptr<ContextState> st, const std::string& path, bool o_creat,
                     bool o_excl)
    : VerbsObject(std::move(st), "xrcd") {
  const int oflags = (o_creat ? O_CREAT : 0) | (o_excl ? O_EXCL : 0);
  int fd = -1;
  if (!path.empty()) {
    fd = ::open(path.c_str(), O_RDONLY | (o_creat ? O_CREAT : 0), 0600);
    if (fd < 0) throw Error("open", errno, path);
  }
  try {
    xrcd_ = open_xrcd(st_->ctx.get("ibv_open_xrcd"), fd, oflags);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    throw;
  }
  if (fd >= 0) ::close(fd);  // the kernel holds the inode, not the fd
}

void VerbsXrcd::close() {
  xrcd_.destroy();
  recorded("ibv_close_xrcd");
}

void VerbsXrcd::release() noexcept {
  if (xrcd_.live()) xrcd_.reset();
}

// --- SRQ
VerbsSrq::VerbsSrq(std::shared_ptr<ContextState> st, std::shared_ptr<VerbsPd> pd,
                   std::shared_ptr<VerbsXrcd> xrcd, std::shared_ptr<VerbsCq> cq,
                   const SrqInitAttr& attr)
    : VerbsObject(std::move(st), "srq"),
      pd_(std::move(pd)),
      xrcd_(std::move(xrcd)),
      cq_(std::move(cq)) {
  ibv_srq_init_attr_ex ex{};
  ex.attr.max_wr = attr.max_wr;
  ex.attr.max_sge = attr.max_sge;
  ex.attr.srq_limit = attr.srq_limit;
  ex.pd = pd_->get("ibv_create_srq_ex");
  if (xrcd_) {
    ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
                   IBV_SRQ_INIT_ATTR_CQ;
    ex.srq_type = IBV_SRQT_XRC;
    ex.xrcd = xrcd_->get("ibv_create_srq_ex");
    ex.cq = cq_->get("ibv_create_srq_ex");
    srq_ = create_srq_ex(st_->ctx.get("ibv_create_srq_ex"), &ex);
    check_rc("ibv_get_srq_num", ibv_get_srq_num(srq_.raw(), &srq_num_), label_);
  } else {
    ibv_srq_init_attr basic{};
    basic.attr = ex.attr;
    srq_ = create_srq(ex.pd, &basic);
  }
  st_->events.add_object(srq_.raw(), ObjectKind::SRQ, id_, srq_num_);
}

void VerbsSrq::post_recv(const RecvWr& wr) {
  ibv_srq* srq = srq_.get("ibv_post_srq_recv");
  IbvRecvWr w;
  to_ibv(wr, w);
  ibv_recv_wr* bad = nullptr;
  check_rc("ibv_post_srq_recv", ibv_post_srq_recv(srq, &w.wr, &bad), label_);
}

void VerbsSrq::arm_limit(uint32_t srq_limit) {
  ibv_srq* srq = srq_.get("ibv_modify_srq");
  ibv_srq_attr a{};
  a.srq_limit = srq_limit;
  check_rc("ibv_modify_srq", ibv_modify_srq(srq, &a, IBV_SRQ_LIMIT), label_);
}

uint32_t VerbsSrq::limit() const {
  ibv_srq* srq = srq_.get("ibv_query_srq");
  ibv_srq_attr a{};
  check_rc("ibv_query_srq", ibv_query_srq(srq, &a), label_);
  return a.srq_limit;
}

uint32_t VerbsSrq::outstanding() const {
  srq_.get("srq.outstanding");
  throw Error("srq.outstanding", EOPNOTSUPP, "libibverbs does not report SRQ occupancy");
}

void VerbsSrq::destroy(TimeNs deadline_ns) {
  const void* raw = srq_.get("ibv_destroy_srq");
  destroy_with_acks(st_->events, raw, id_, "ibv_destroy_srq", label_, deadline_ns,
                    [this] { srq_.destroy(); });
  recorded("ibv_destroy_srq");
}

void VerbsSrq::release() noexcept {
  if (!srq_.live()) return;
  st_->events.force_destroy(srq_.raw(), id_);
  st_->events.remove_object(srq_.raw(), id_);
  srq_.reset();
}

}  // namespace rdmalab::verbs
