#include "verbs/context.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace rdmalab::verbs {

namespace {
template <class T>
std::shared_ptr<T> shared_of(Object& o, const std::string& verb) {
  auto* v = dynamic_cast<T*>(&o);
  if (v == nullptr) throw Error(verb, EINVAL, o.label() + " is not a verbs-backend object");
  return v->shared_from_this();
}

// What ibv_create_qp takes must be of this context: libibverbs would otherwise make the QP on
// the PD's context (ibv_create_qp uses pd->context), silently.
void check_init_attr(const Context& ctx, const QpInitAttr& a, const std::string& verb) {
  if (a.pd) check_owner(ctx, *a.pd, verb, "pd");
  if (a.send_cq) check_owner(ctx, *a.send_cq, verb, "send_cq");
  if (a.recv_cq) check_owner(ctx, *a.recv_cq, verb, "recv_cq");
  if (a.srq) check_owner(ctx, *a.srq, verb, "srq");
  if (a.xrcd) check_owner(ctx, *a.xrcd, verb, "xrcd");
}
}  // namespace

std::string driver_name(const std::string& device_name, const std::string& sysfs_root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path link = fs::path(sysfs_root) / device_name / "device" / "driver";
  const fs::path target = fs::read_symlink(link, ec);
  if (!ec && !target.filename().empty()) return target.filename().string();
  std::string s = device_name;
  while (!s.empty() && std::isdigit(static_cast<unsigned char>(s.back()))) s.pop_back();
  if (const auto us = s.find('_'); us != std::string::npos) s.resize(us);
  return s;
}

DeviceCaps query_caps(ibv_context* ctx, const std::string& sysfs_root) {
  DeviceFacts f;
  f.name = ibv_get_device_name(ctx->device);
  f.driver = driver_name(f.name, sysfs_root);
  f.node_type = ctx->device->node_type;
  f.kernel = running_kernel();
  check_rc("ibv_query_device_ex", ibv_query_device_ex(ctx, nullptr, &f.attr), f.name);
  ibv_port_attr port{};
  check_rc("ibv_query_port", ibv_query_port(ctx, 1, &port), f.name + " port 1");
  f.port1_link_layer = port.link_layer;
  return caps_from(f);
}

VerbsContext::VerbsContext(ibv_device* dev, History* history, std::string host)
    : st_(std::make_shared<ContextState>(history, std::move(host))),
      id_(new_object_id()),
      label_("ctx:" + std::to_string(id_)) {
  st_->ctx_id = id_;
  st_->ctx_label = label_;
  st_->ctx = open_device(dev);
  opened(st_->ctx.raw());
}

VerbsContext::VerbsContext(ibv_context* borrowed, History* history, std::string host)
    : st_(std::make_shared<ContextState>(history, std::move(host))),
      id_(new_object_id()),
      label_("ctx:" + std::to_string(id_)) {
  st_->ctx_id = id_;
  st_->ctx_label = label_;
  st_->ctx = Handle<ibv_context>(borrowed, "ibv_close_device", [](ibv_context*) { return 0; });
  opened(borrowed);
}

void VerbsContext::opened(ibv_context* ctx) {
  st_->caps = query_caps(ctx, kSysfsRoot);
  st_->events.start(ctx);
  st_->record(label_, "verb", {{"verb", "ibv_open_device"}, {"device", st_->caps.name}});
}

template <class T>
std::shared_ptr<T> VerbsContext::adopt(std::shared_ptr<T> obj) {
  std::lock_guard<std::mutex> lock(mu_);
  owned_.push_back(obj);
  return obj;
}

Gid VerbsContext::query_gid(uint8_t port_num, int index) const {
  ibv_gid gid{};
  check_rc("ibv_query_gid", ibv_query_gid(st_->ctx.get("ibv_query_gid"), port_num, index, &gid),
           "port " + std::to_string(port_num) + " index " + std::to_string(index));
  return from_ibv(gid);
}

PortState VerbsContext::query_port(uint8_t port_num) const {
  ibv_port_attr attr{};
  check_rc("ibv_query_port", ibv_query_port(st_->ctx.get("ibv_query_port"), port_num, &attr),
           "port " + std::to_string(port_num));
  return from_ibv(attr.state);
}

std::shared_ptr<Pd> VerbsContext::alloc_pd() {
  return adopt(std::make_shared<VerbsPd>(st_));
}

std::shared_ptr<Mr> VerbsContext::reg_mr(Pd& pd, uint64_t length, uint32_t access) {
  check_owner(*this, pd, "ibv_reg_mr", "pd");
  return adopt(
      std::make_shared<VerbsMr>(st_, shared_of<VerbsPd>(pd, "ibv_reg_mr"), length, access));
}

std::shared_ptr<Cq> VerbsContext::create_cq(int cqe) {
  return adopt(std::make_shared<VerbsCq>(st_, cqe));
}

std::shared_ptr<Srq> VerbsContext::create_srq(Pd& pd, const SrqInitAttr& attr) {
  check_owner(*this, pd, "ibv_create_srq", "pd");
  return adopt(std::make_shared<VerbsSrq>(st_, shared_of<VerbsPd>(pd, "ibv_create_srq"), nullptr,
                                          nullptr, attr));
}

std::shared_ptr<Srq> VerbsContext::create_srq_xrc(Pd& pd, Xrcd& xrcd, Cq& cq,
                                                  const SrqInitAttr& attr) {
  const std::string verb = "ibv_create_srq_ex";
  check_owner(*this, pd, verb, "pd");
  check_owner(*this, xrcd, verb, "xrcd");
  check_owner(*this, cq, verb, "cq");
  return adopt(std::make_shared<VerbsSrq>(st_, shared_of<VerbsPd>(pd, verb),
                                          shared_of<VerbsXrcd>(xrcd, verb),
                                          shared_of<VerbsCq>(cq, verb), attr));
}

std::shared_ptr<Xrcd> VerbsContext::open_xrcd(const std::string& path, bool o_creat, bool o_excl) {
  return adopt(std::make_shared<VerbsXrcd>(st_, path, o_creat, o_excl));
}

std::shared_ptr<Qp> VerbsContext::create_qp(const QpInitAttr& attr) {
  check_init_attr(*this, attr, "ibv_create_qp");
  return adopt(std::make_shared<VerbsQp>(st_, attr));
}

std::shared_ptr<Qp> VerbsContext::create_cm_qp(const QpInitAttr& attr, const CmBinding& cm) {
  check_init_attr(*this, attr, "rdma_create_qp");
  return adopt(std::make_shared<VerbsQp>(st_, attr, cm));
}

std::shared_ptr<Qp> VerbsContext::open_qp(Xrcd& xrcd, uint32_t qp_num) {
  check_owner(*this, xrcd, "ibv_open_qp", "xrcd");
  return adopt(std::make_shared<VerbsQp>(st_, shared_of<VerbsXrcd>(xrcd, "ibv_open_qp"), qp_num));
}

std::optional<AsyncEvent> VerbsContext::get_async_event(TimeNs deadline_ns) {
  st_->ctx.get("ibv_get_async_event");
  return st_->events.get(deadline_ns);
}

void VerbsContext::interrupt_get_async_event() {
  st_->events.interrupt();
}

void VerbsContext::ack_async_event(const AsyncEvent& ev) {
  st_->ctx.get("ibv_ack_async_event");
  st_->events.ack(ev);
}

void VerbsContext::close() {
  st_->ctx.get("ibv_close_device");
  std::vector<std::shared_ptr<Releasable>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : owned_) {
      if (auto p = w.lock()) live.push_back(std::move(p));
    }
    owned_.clear();
  }
  // Newest first within a rank, ranks in uverbs order: QPs, SRQs, CQs, MRs, PDs, XRCDs.
  std::reverse(live.begin(), live.end());
  std::stable_sort(live.begin(), live.end(),
                   [](const auto& a, const auto& b) { return a->rank() < b->rank(); });
  for (auto& obj : live) obj->release();
  st_->events.stop();
  st_->ctx.destroy();
  st_->record(label_, "verb", {{"verb", "ibv_close_device"}});
}

}  // namespace rdmalab::verbs
