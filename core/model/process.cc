#include "model/process.h"

#include <algorithm>
#include <sstream>

#include "model/cm_ib.h"
#include "model/cm_iw.h"
#include "model/cm_rdma.h"
#include "model/context.h"
#include "model/qp.h"

namespace rdmalab::model {

// ---------------------------------------------------------------- process

ModelProcess::ModelProcess(Env& env, ModelHost& host, std::string name, uint64_t pid)
    : env_(env), token_(env.token), host_(host), name_(std::move(name)), pid_(pid) {}

std::shared_ptr<Context> ModelProcess::open_device(const std::string& device_name) {
  if (!token_->alive) throw Error("ibv_open_device", EBADF, "lab shut down");
  if (!alive_) throw Error("ibv_open_device", ESRCH, label() + " was killed");
  Device& dev = host_.device();
  if (!device_name.empty() && device_name != dev.caps.name) {
    throw Error("ibv_open_device", ENODEV, "no device '" + device_name + "' on " + host_.name());
  }
  env_.enter_verb(host_.name(), "ibv_open_device", label());
  if (dev.removal != Device::Removal::kNone)  // its uverbs cdev is gone (ib_uverbs_remove_one)
    throw Error("ibv_open_device", ENODEV, "'" + dev.caps.name + "' was removed");
  if (dev.fatal) throw Error("ibv_open_device", EIO, "device fatal");
  auto ctx = std::make_shared<ModelContext>(dev, *this);
  dev.contexts.push_back(ctx.get());
  contexts_.push_back(ctx);
  env_.record_fields(host_.name(), ctx->label(), "verb",
                     {{"verb", "ibv_open_device"}, {"device", dev.caps.name}, {"process", name_}});
  return ctx;
}

std::shared_ptr<CmEventChannel> ModelProcess::create_event_channel() {
  if (!token_->alive) throw Error("rdma_create_event_channel", EBADF, "lab shut down");
  if (!alive_) throw Error("rdma_create_event_channel", ESRCH, label() + " was killed");
  env_.enter_verb(host_.name(), "rdma_create_event_channel", label());
  auto ch = std::make_shared<ModelCmEventChannel>(*this);
  channels_.push_back(ch);
  env_.record_fields(host_.name(), ch->label(), "verb",
                     {{"verb", "rdma_create_event_channel"}, {"process", name_}});
  return ch;
}

std::shared_ptr<Context> ModelProcess::cm_context() {
  if (!cm_ctx_ || cm_ctx_->destroyed()) cm_ctx_ = open_device("");
  return cm_ctx_;
}

// SIGKILL: ucma closes the CM ids first (what cm_destroy_id sends, it sends), then uverbs
// releases every handle, newest first by type (QPs, SRQs, CQs, MRs, PDs, XRCD references),
// then the contexts, without waiting for event acks.
void ModelProcess::kill() {
  if (!token_->alive || !alive_) return;
  alive_ = false;
  env_.fault(host_.name(), label(), "kill", {{"process", name_}, {"pid", pid_}});
  release_everything(Release::kKill);
}

void ModelProcess::crash() {
  if (!token_->alive || !alive_) return;
  alive_ = false;
  env_.record_fields(host_.name(), label(), "process_crash", {{"process", name_}, {"pid", pid_}});
  release_everything(Release::kKill);
}

void ModelProcess::release_everything(Release why) {
  auto channels = channels_;
  for (size_t i = channels.size(); i-- > 0;) channels[i]->release(why);
  channels_.clear();
  std::vector<std::shared_ptr<Owned>> objs;
  for (const auto& ctx : contexts_) {
    auto o = ctx->owned();
    objs.insert(objs.end(), o.begin(), o.end());
  }
  std::stable_sort(objs.begin(), objs.end(), [](const auto& a, const auto& b) {
    if (a->rank() != b->rank()) return a->rank() < b->rank();
    return a->owned_id() > b->owned_id();
  });
  for (auto& o : objs) o->release(why);
  auto ctxs = contexts_;
  for (size_t i = ctxs.size(); i-- > 0;) ctxs[i]->release_all(why);
  contexts_.clear();
  cm_ctx_.reset();
}

void ModelProcess::context_closed(const ModelContext* ctx) {
  contexts_.erase(std::remove_if(contexts_.begin(), contexts_.end(),
                                 [ctx](const auto& c) { return c.get() == ctx; }),
                  contexts_.end());
}

void ModelProcess::shutdown() {
  auto channels = channels_;
  for (size_t i = channels.size(); i-- > 0;) channels[i]->release(Release::kClose);
  channels_.clear();
  cm_ctx_.reset();
  auto ctxs = contexts_;
  for (size_t i = ctxs.size(); i-- > 0;) ctxs[i]->release_all(Release::kClose);
  contexts_.clear();
}

std::map<std::string, uint64_t> ModelProcess::kernel_objects() const {
  static constexpr const char* kKind[] = {"qp", "srq", "cq", "mr", "pd", "xrcd"};  // by Rank
  std::map<std::string, uint64_t> out;
  for (const auto& ch : channels_) {
    if (size_t n = ch->live_ids()) out["cm_id"] += n;
  }
  for (const auto& ctx : contexts_) {
    if (ctx->destroyed()) continue;
    ++out["ctx"];
    for (const auto& o : ctx->owned()) {
      if (o->owned_live()) ++out[kKind[static_cast<int>(o->rank())]];
    }
  }
  return out;
}

std::string ModelProcess::dump() const {
  std::ostringstream out;
  out << "  " << label() << " pid " << pid_ << (alive_ ? "" : " (killed)") << "\n";
  for (const auto& ch : channels_) out << ch->dump();
  for (const auto& ctx : contexts_) out << ctx->dump();
  return out.str();
}

// ---------------------------------------------------------------- host

ModelHost::ModelHost(Env& env, Fabric& fabric, std::string name, const Personality& p, int index)
    : env_(env),
      token_(env.token),
      name_(std::move(name)),
      device_(std::make_unique<Device>(env, fabric, p, name_, index)) {
  env_.devices[name_] = device_.get();
}

DeviceCaps ModelHost::device_caps(const std::string& device_name) const {
  if (!device_name.empty() && device_name != device_->caps.name) {
    throw Error("ibv_query_device", ENODEV, "no device '" + device_name + "' on " + name_);
  }
  return device_->caps;
}

std::shared_ptr<Process> ModelHost::create_process(const std::string& name) {
  if (!token_->alive) throw Error("create_process", EBADF, "lab shut down");
  if (device_->host_down) throw Error("create_process", EHOSTDOWN, name_ + " is rebooting");
  for (const auto& p : processes_) {
    if (p->alive() && p->name() == name)
      throw Error("create_process", EEXIST, "process '" + name + "' exists on " + name_);
  }
  auto p = std::make_shared<ModelProcess>(env_, *this, name, env_.next_pid++);
  processes_.push_back(p);
  env_.record_fields(name_, p->label(), "process_start", {{"process", name}, {"pid", p->pid()}});
  return p;
}

std::vector<std::shared_ptr<Process>> ModelHost::processes() const {
  return {processes_.begin(), processes_.end()};
}

// The CM state goes first, with nothing sent; then the processes die as by SIGKILL (their
// ids find no CM state left to send from); then the device forgets everything.
void ModelHost::crash() {
  if (device_->ib_cm) device_->ib_cm->reset();
  if (device_->iw_cm) device_->iw_cm->reset();
  for (size_t i = processes_.size(); i-- > 0;) processes_[i]->crash();
  for (auto& [path, x] : device_->xrcd_inodes) x->tgt_qps.clear();
  std::vector<QpCore*> cores;
  for (const auto& [qpn, core] : device_->qp_table) cores.push_back(core);
  for (QpCore* core : cores) core->destroy();
  device_->reset_after_reboot();
}

void ModelHost::shutdown() {
  for (size_t i = processes_.size(); i-- > 0;) processes_[i]->shutdown();
  // Break the XRCD <-> TGT QP ownership cycle of QPs that outlived every process.
  for (auto& [path, x] : device_->xrcd_inodes) x->tgt_qps.clear();
  std::vector<QpCore*> cores;
  for (const auto& [qpn, core] : device_->qp_table) cores.push_back(core);
  for (QpCore* core : cores) {
    if (core->xrcd) {
      core->xrcd->tgt_qps.clear();
      core->xrcd.reset();
    }
  }
  device_->xrcd_inodes.clear();
}

std::string ModelHost::dump() const {
  std::ostringstream out;
  const Device& d = *device_;
  out << "host " << name_ << ": " << d.caps.name << " (" << d.caps.personality << ") port "
      << (d.port_up ? "ACTIVE" : "DOWN") << (d.fatal ? " FATAL" : "") << ", " << d.qp_table.size()
      << " QPs, " << d.pending_eqes() << " EQEs pending" << (d.host_down ? " HOST DOWN" : "")
      << "\n";
  if (d.ib_cm) out << d.ib_cm->dump();
  if (d.iw_cm) out << d.iw_cm->dump();
  for (const auto& p : processes_) out << p->dump();
  return out.str();
}

}  // namespace rdmalab::model
