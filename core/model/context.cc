#include "model/context.h"

#include <algorithm>
#include <sstream>

#include "model/device.h"
#include "model/process.h"
#include "model/qp.h"
#include "model/resources.h"

namespace rdmalab::model {
namespace {

// The model object behind a reference the caller passes in: ours, of this context (a uverbs
// handle of another context is unknown to this one: check_owner's EINVAL), live.
template <class T, class U>
T& own(U& obj, const ModelContext& ctx, const std::string& verb, const char* what) {
  T* p = dynamic_cast<T*>(&obj);
  if (p == nullptr) throw Error(verb, EINVAL, std::string(what) + " is not a model object");
  check_owner(ctx, *p, verb, what);
  p->state_of().check(verb);
  return *p;
}

nlohmann::json verb_data(const char* verb) {
  return {{"verb", verb}};
}

}  // namespace

ModelContext::ModelContext(Device& dev, ModelProcess& proc)
    : ModelObject(dev.env, dev.host, "ctx"), dev_(dev), proc_(proc) {}

const DeviceCaps& ModelContext::caps() const {
  return dev_.caps;
}

Gid ModelContext::query_gid(uint8_t port_num, int index) const {
  st_.check("ibv_query_gid");
  if (port_num != 1 || index != 0)
    throw Error("ibv_query_gid", EINVAL, "model devices have port 1, GID index 0");
  return dev_.gid;
}

PortState ModelContext::query_port(uint8_t port_num) const {
  st_.check("ibv_query_port");
  if (port_num != 1) throw Error("ibv_query_port", EINVAL, "no port " + std::to_string(port_num));
  return dev_.port_up && !dead() ? PortState::ACTIVE : PortState::DOWN;
}

bool ModelContext::dead() const {
  return dev_.fatal || disassociated_;
}

void ModelContext::check_alive_device(const std::string& verb) const {
  if (dead()) throw Error(verb, EIO, disassociated_ ? "context disassociated" : "device fatal");
}

template <class T>
std::shared_ptr<T> ModelContext::adopt(std::shared_ptr<T> obj) {
  objects_.push_back(obj);
  return obj;
}

std::shared_ptr<Pd> ModelContext::alloc_pd() {
  enter("ibv_alloc_pd");
  check_alive_device("ibv_alloc_pd");
  auto pd = adopt(std::make_shared<ModelPd>(*this));
  env().record(st_.host, pd->label(), "verb", verb_data("ibv_alloc_pd"));
  return pd;
}

std::shared_ptr<Mr> ModelContext::reg_mr(Pd& pd_in, uint64_t length, uint32_t access) {
  const std::string verb = "ibv_reg_mr";
  enter(verb);
  check_alive_device(verb);
  auto& pd = own<ModelPd>(pd_in, *this, verb, "pd");
  if ((access & (ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC)) && !(access & ACCESS_LOCAL_WRITE)) {
    throw Error(verb, EINVAL, "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE");
  }
  if (length > (1ull << 30)) throw Error(verb, ENOMEM, "model MRs are at most 1 GiB");
  auto mr = adopt(std::make_shared<ModelMr>(*this, pd, length, access, dev_.alloc_key()));
  env().record_fields(
      st_.host, mr->label(), "verb",
      {{"verb", verb}, {"length", length}, {"access", access}, {"lkey", mr->lkey()}});
  return mr;
}

std::shared_ptr<Cq> ModelContext::create_cq(int cqe) {
  enter("ibv_create_cq");
  check_alive_device("ibv_create_cq");
  if (cqe < 1 || static_cast<uint32_t>(cqe) > dev_.caps.max_cqe) {
    throw Error("ibv_create_cq", EINVAL, "cqe " + std::to_string(cqe) + " outside 1..max_cqe");
  }
  const CqSize size = cq_size(dev_.pers, cqe);  // the provider's rounding (personality.cc)
  auto cq = adopt(std::make_shared<ModelCq>(*this, size.cqe, size.capacity));
  env().record_fields(st_.host, cq->label(), "verb",
                      {{"verb", "ibv_create_cq"}, {"cqe", cqe}, {"cqe_reported", size.cqe}});
  return cq;
}

std::shared_ptr<Srq> ModelContext::create_srq(Pd& pd_in, const SrqInitAttr& attr) {
  const std::string verb = "ibv_create_srq";
  enter(verb);
  check_alive_device(verb);
  if (!dev_.caps.srq) throw Error(verb, EOPNOTSUPP, dev_.caps.personality + " has no SRQ");
  auto& pd = own<ModelPd>(pd_in, *this, verb, "pd");
  if (attr.max_wr == 0 || attr.max_wr > dev_.caps.max_srq_wr || attr.max_sge > dev_.caps.max_sge) {
    throw Error(verb, EINVAL, "max_wr or max_sge outside the device caps");
  }
  auto srq =
      adopt(std::make_shared<ModelSrq>(*this, pd, attr, dev_.alloc_srqn(), nullptr, nullptr));
  env().record_fields(st_.host, srq->label(), "verb",
                      {{"verb", verb}, {"srq_num", srq->srq_num()}});
  return srq;
}

std::shared_ptr<Srq> ModelContext::create_srq_xrc(Pd& pd_in, Xrcd& xrcd_in, Cq& cq_in,
                                                  const SrqInitAttr& attr) {
  const std::string verb = "ibv_create_srq_ex";
  enter(verb);
  check_alive_device(verb);
  if (!dev_.caps.srq || !dev_.caps.xrc)
    throw Error(verb, EOPNOTSUPP, dev_.caps.personality + " has no XRC SRQ");
  auto& pd = own<ModelPd>(pd_in, *this, verb, "pd");
  auto& xrcd = own<ModelXrcd>(xrcd_in, *this, verb, "xrcd");
  auto& cq = own<ModelCq>(cq_in, *this, verb, "cq");
  if (attr.max_wr == 0 || attr.max_wr > dev_.caps.max_srq_wr || attr.max_sge > dev_.caps.max_sge) {
    throw Error(verb, EINVAL, "max_wr or max_sge outside the device caps");
  }
  auto srq =
      adopt(std::make_shared<ModelSrq>(*this, pd, attr, dev_.alloc_srqn(), &cq, xrcd.core()));
  env().record_fields(
      st_.host, srq->label(), "verb",
      {{"verb", verb}, {"srq_num", srq->srq_num()}, {"xrcd", xrcd.core()->label()}});
  return srq;
}

// ibv_open_xrcd: shared by inode among the processes of the host; o_creat / o_excl as open(2).
std::shared_ptr<Xrcd> ModelContext::open_xrcd(const std::string& path, bool o_creat, bool o_excl) {
  const std::string verb = "ibv_open_xrcd";
  enter(verb);
  check_alive_device(verb);
  if (!dev_.caps.xrc) throw Error(verb, EOPNOTSUPP, dev_.caps.personality + " has no XRC");
  std::shared_ptr<XrcdCore> core;
  auto it = path.empty() ? dev_.xrcd_inodes.end() : dev_.xrcd_inodes.find(path);
  if (it != dev_.xrcd_inodes.end()) {
    if (o_creat && o_excl) throw Error(verb, EEXIST, "XRCD for '" + path + "' exists");
    core = it->second;
  } else {
    if (!path.empty() && !o_creat) throw Error(verb, ENOENT, "no XRCD for '" + path + "'");
    core = std::make_shared<XrcdCore>(dev_, path, env().new_id());
    if (!path.empty()) dev_.xrcd_inodes[path] = core;
  }
  auto xrcd = adopt(std::make_shared<ModelXrcd>(*this, core));
  env().record_fields(
      st_.host, xrcd->label(), "verb",
      {{"verb", verb}, {"path", path}, {"xrcd", core->label()}, {"handles", core->handles}});
  return xrcd;
}

std::shared_ptr<Qp> ModelContext::create_qp(const QpInitAttr& a) {
  const std::string verb = "ibv_create_qp";
  enter(verb);
  check_alive_device(verb);
  const bool xrc = a.qp_type == QpType::XRC_SEND || a.qp_type == QpType::XRC_RECV;
  if (xrc && !dev_.caps.xrc) throw Error(verb, EOPNOTSUPP, dev_.caps.personality + " has no XRC");
  if (a.qp_type == QpType::UD && !dev_.caps.ud)
    throw Error(verb, EOPNOTSUPP, dev_.caps.personality + " has no UD");
  ModelPd* pd = nullptr;
  ModelCq* scq = nullptr;
  ModelCq* rcq = nullptr;
  ModelSrq* srq = nullptr;
  std::shared_ptr<XrcdCore> xrcd;
  if (a.qp_type == QpType::XRC_RECV) {  // TGT: an XRCD, no PD, CQs or SRQ (semantics.md D)
    if (!a.xrcd) throw Error(verb, EINVAL, "XRC_RECV needs an xrcd");
    xrcd = own<ModelXrcd>(*a.xrcd, *this, verb, "xrcd").core();
  } else {
    if (!a.pd) throw Error(verb, EINVAL, "no pd");
    if (!a.send_cq) throw Error(verb, EINVAL, "no send_cq");
    pd = &own<ModelPd>(*a.pd, *this, verb, "pd");
    scq = &own<ModelCq>(*a.send_cq, *this, verb, "send_cq");
    if (a.qp_type != QpType::XRC_SEND) {
      if (!a.recv_cq) throw Error(verb, EINVAL, "no recv_cq");
      rcq = &own<ModelCq>(*a.recv_cq, *this, verb, "recv_cq");
      if (a.srq) srq = &own<ModelSrq>(*a.srq, *this, verb, "srq");
      if (srq && srq->is_xrc()) throw Error(verb, EINVAL, "an XRC SRQ cannot back an RC/UD QP");
    }
  }
  const QpCap& c = a.cap;
  if (c.max_send_wr > dev_.caps.max_qp_wr || c.max_recv_wr > dev_.caps.max_qp_wr ||
      c.max_send_sge > dev_.caps.max_sge || c.max_recv_sge > dev_.caps.max_sge) {
    throw Error(verb, EINVAL, "QP caps above the device caps");
  }
  if (dev_.qp_table.size() >= dev_.caps.max_qp) throw Error(verb, ENOMEM, "max_qp reached");
  const uint32_t qpn = dev_.alloc_qpn();
  auto core = std::make_shared<QpCore>(dev_, 0, qpn, a, pd, scq, rcq, srq, xrcd);
  auto qp = adopt(std::make_shared<ModelQp>(*this, core, false));
  core->id = qp->id();
  core->handles.push_back(qp.get());
  dev_.qp_table[qpn] = core.get();
  if (xrcd) xrcd->tgt_qps[qpn] = core;
  env().record_fields(
      st_.host, qp->label(), "verb",
      {{"verb", verb}, {"qp_num", qpn}, {"qp_type", std::string(to_string(a.qp_type))}});
  return qp;
}

std::shared_ptr<Qp> ModelContext::open_qp(Xrcd& xrcd_in, uint32_t qp_num) {
  const std::string verb = "ibv_open_qp";
  enter(verb);
  check_alive_device(verb);
  auto& xrcd = own<ModelXrcd>(xrcd_in, *this, verb, "xrcd");
  auto it = xrcd.core()->tgt_qps.find(qp_num);
  if (it == xrcd.core()->tgt_qps.end()) {  // ib_open_qp: -EINVAL when the XRCD has no such QP
    throw Error(verb, EINVAL,
                "no XRC TGT QP " + std::to_string(qp_num) + " in " + xrcd.core()->label());
  }
  auto qp = adopt(std::make_shared<ModelQp>(*this, it->second, true));
  it->second->handles.push_back(qp.get());
  env().record_fields(st_.host, qp->label(), "verb",
                      {{"verb", verb}, {"qp_num", qp_num}, {"real_qp", it->second->label()}});
  return qp;
}

// ---------------------------------------------------------------- async events

void ModelContext::push_event(AsyncEvent ev) {
  if (!st_.live()) return;
  ev.seq = next_event_seq_++;
  events_.push_back(ev);
}

std::optional<AsyncEvent> ModelContext::get_async_event(TimeNs deadline_ns) {
  enter("ibv_get_async_event");
  auto self = shared_from_this();  // the process may be killed while we wait
  env().runtime.wait_until([this] { return !events_.empty() || !st_.live(); }, deadline_ns);
  if (!st_.live() || events_.empty()) return std::nullopt;
  AsyncEvent ev = events_.front();
  events_.pop_front();
  if (ev.object_id != 0) {
    ++counts_[ev.object_id].reported;  // uverbs counts events_reported when user space reads
    read_unacked_[ev.seq] = ev.object_id;
  }
  env().record_fields(st_.host, st_.label, "async_event_read",
                      {{"event", std::string(to_string(ev.type))},
                       {"seq", ev.seq},
                       {"object_id", ev.object_id},
                       {"qp_num", ev.qp_num},
                       {"srq_num", ev.srq_num},
                       {"port_num", ev.port_num}});
  return ev;
}

void ModelContext::ack_async_event(const AsyncEvent& ev) {
  enter("ibv_ack_async_event");
  auto it = read_unacked_.find(ev.seq);
  const bool known = it != read_unacked_.end();
  if (known) {
    ++counts_[it->second].completed;
    read_unacked_.erase(it);
  }
  env().record_fields(st_.host, st_.label, "async_event_ack",
                      {{"event", std::string(to_string(ev.type))},
                       {"seq", ev.seq},
                       {"object_id", ev.object_id},
                       {"known", known}});
}

void ModelContext::forget_object(uint64_t object_id) {
  events_.erase(
      std::remove_if(events_.begin(), events_.end(),
                     [object_id](const AsyncEvent& e) { return e.object_id == object_id; }),
      events_.end());
  counts_.erase(object_id);
  for (auto it = read_unacked_.begin(); it != read_unacked_.end();) {
    it = it->second == object_id ? read_unacked_.erase(it) : std::next(it);
  }
}

bool ModelContext::acked(uint64_t object_id) const {
  return unacked(object_id) == 0;
}

uint64_t ModelContext::unacked(uint64_t object_id) const {
  auto it = counts_.find(object_id);
  return it == counts_.end() ? 0 : it->second.reported - it->second.completed;
}

// ---------------------------------------------------------------- lifetime

void ModelContext::drop_owned(uint64_t id) {
  objects_.erase(
      std::remove_if(objects_.begin(), objects_.end(),
                     [id](const std::shared_ptr<Owned>& o) { return o->owned_id() == id; }),
      objects_.end());
}

void ModelContext::release_all(Release why) {
  if (!st_.live()) return;
  auto self = shared_from_this();
  auto objs = objects_;  // release() drops each from objects_
  std::stable_sort(objs.begin(), objs.end(), [](const auto& a, const auto& b) {
    if (a->rank() != b->rank()) return a->rank() < b->rank();
    return a->owned_id() > b->owned_id();  // newest first
  });
  for (auto& o : objs) o->release(why);
  events_.clear();
  counts_.clear();
  read_unacked_.clear();
  auto& cs = dev_.contexts;
  cs.erase(std::remove(cs.begin(), cs.end(), this), cs.end());
  st_.end(why, "ibv_close_device");
  proc_.context_closed(this);
  dev_.context_closed();
}

void ModelContext::close() {
  enter("ibv_close_device");
  auto self = shared_from_this();
  auto objs = objects_;
  std::stable_sort(objs.begin(), objs.end(), [](const auto& a, const auto& b) {
    if (a->rank() != b->rank()) return a->rank() < b->rank();
    return a->owned_id() > b->owned_id();
  });
  for (auto& o : objs) o->release(Release::kClose);
  release_all(Release::kVerb);
}

std::string ModelContext::dump() const {
  std::ostringstream out;
  out << "    " << st_.label << (st_.live() ? "" : " (ended)") << " events queued "
      << events_.size() << " unacked " << read_unacked_.size() << "\n";
  for (const auto& o : objects_) {
    out << "      ";
    if (auto* qp = dynamic_cast<ModelQp*>(o.get())) {
      const auto& c = *qp->core();
      out << qp->label() << " qpn " << c.qpn << " " << to_string(c.type) << " "
          << to_string(c.state) << " sq " << c.sq_outstanding() << " rq " << c.rq_outstanding()
          << (qp->is_open_handle() ? " open-handle" : "")
          << (c.destroyed ? " real-qp-destroyed" : "");
    } else if (auto* srq = dynamic_cast<ModelSrq*>(o.get())) {
      out << srq->label() << " srqn " << srq->srq_num() << " outstanding " << srq->outstanding()
          << " limit " << srq->limit();
    } else if (auto* cq = dynamic_cast<ModelCq*>(o.get())) {
      out << cq->label() << " cqe " << cq->cqe() << " depth " << cq->depth()
          << (cq->overflowed() ? " OVERFLOWED" : "");
    } else if (auto* mr = dynamic_cast<ModelMr*>(o.get())) {
      out << mr->label() << " lkey " << mr->lkey() << " length " << mr->length();
    } else if (auto* pd = dynamic_cast<ModelPd*>(o.get())) {
      out << pd->label() << " usecnt " << pd->usecnt;
    } else if (auto* x = dynamic_cast<ModelXrcd*>(o.get())) {
      out << x->label() << " " << x->core()->label() << " path '" << x->core()->path << "' handles "
          << x->core()->handles << " tgt_qps " << x->core()->tgt_qps.size();
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace rdmalab::model
