#include "model/resources.h"

#include "model/context.h"
#include "model/device.h"
#include "model/qp.h"

namespace rdmalab::model {

// ---------------------------------------------------------------- PD

ModelPd::ModelPd(ModelContext& ctx) : ModelObject(ctx.state_of(), "pd"), ctx_(ctx) {}

void ModelPd::dealloc() {
  enter("ibv_dealloc_pd");
  if (usecnt > 0) {
    throw Error("ibv_dealloc_pd", EBUSY,
                st_.label + ": " + std::to_string(usecnt) + " objects use it");
  }
  release(Release::kVerb);
}

void ModelPd::release(Release why) {
  if (!st_.live()) return;
  st_.end(why, "ibv_dealloc_pd");
  ctx_.drop_owned(st_.id);
}

// ---------------------------------------------------------------- MR

ModelMr::ModelMr(ModelContext& ctx, ModelPd& pd, uint64_t length, uint32_t access, uint32_t key)
    : ModelObject(ctx.state_of(), "mr"),
      ctx_(ctx),
      pd_(&pd),
      access_(access),
      key_(key),
      bytes_(length, 0) {
  ++pd_->usecnt;
  ctx_.dev().mr_table[key_] = this;
}

std::vector<uint8_t> ModelMr::read(uint64_t offset, uint64_t len) const {
  st_.check("mr_read");
  if (!in_bounds(offset, len)) throw Error("mr_read", EINVAL, st_.label + ": range outside the MR");
  return {bytes_.begin() + static_cast<ptrdiff_t>(offset),
          bytes_.begin() + static_cast<ptrdiff_t>(offset + len)};
}

void ModelMr::write(uint64_t offset, const std::vector<uint8_t>& bytes) {
  st_.check("mr_write");
  if (!in_bounds(offset, bytes.size()))
    throw Error("mr_write", EINVAL, st_.label + ": range outside the MR");
  std::copy(bytes.begin(), bytes.end(), bytes_.begin() + static_cast<ptrdiff_t>(offset));
}

void ModelMr::dereg() {
  enter("ibv_dereg_mr");
  release(Release::kVerb);
}

void ModelMr::release(Release why) {
  if (!st_.live()) return;
  ctx_.dev().mr_table.erase(key_);
  --pd_->usecnt;
  st_.end(why, "ibv_dereg_mr", {{"lkey", key_}});
  ctx_.drop_owned(st_.id);
}

// ---------------------------------------------------------------- CQ

ModelCq::ModelCq(ModelContext& ctx, int cqe, int capacity)
    : ModelObject(ctx.state_of(), "cq"), ctx_(ctx), cqe_(cqe), capacity_(capacity) {
  ctx_.dev().cq_table[st_.id] = this;
}

std::vector<WorkCompletion> ModelCq::poll(int max) {
  enter("ibv_poll_cq");
  std::vector<WorkCompletion> out;
  while (max-- > 0 && !entries_.empty()) {
    out.push_back(entries_.front());
    entries_.pop_front();
  }
  return out;
}

// rdma-core ibv_cmd_destroy_cq waits until every async event reported on the CQ was acked.
void ModelCq::destroy(TimeNs deadline_ns) {
  enter("ibv_destroy_cq");
  if (usecnt > 0) {
    throw Error("ibv_destroy_cq", EBUSY,
                st_.label + ": " + std::to_string(usecnt) + " QPs/SRQs use it");
  }
  const bool acked =
      env().runtime.wait_until([this] { return !st_.live() || ctx_.acked(st_.id); }, deadline_ns);
  st_.check("ibv_destroy_cq");
  if (!acked) {
    throw Error("ibv_destroy_cq", EBUSY,
                st_.label + ": " + std::to_string(ctx_.unacked(st_.id)) +
                    " async events read and not acked");
  }
  release(Release::kVerb);
}

void ModelCq::release(Release why) {
  if (!st_.live()) return;
  ctx_.dev().cq_table.erase(st_.id);
  ctx_.forget_object(st_.id);
  st_.end(why, "ibv_destroy_cq");
  ctx_.drop_owned(st_.id);
}

void ModelCq::push(const WorkCompletion& wc, const std::string& qp_label) {
  if (!st_.live()) return;
  Device& dev = ctx_.dev();
  nlohmann::json data = {{"wr_id", wc.wr_id},
                         {"status", std::string(to_string(wc.status))},
                         {"opcode", std::string(to_string(wc.opcode))},
                         {"qp_num", wc.qp_num},
                         {"byte_len", wc.byte_len},
                         {"cq", st_.label}};
  const bool full = entries_.size() >= static_cast<size_t>(capacity_);
  if (!overflowed_ && !full) {
    entries_.push_back(wc);
    env().record(st_.host, qp_label, "wc", std::move(data));
    return;
  }
  env().record(st_.host, qp_label, "wc_lost", std::move(data));
  if (overflowed_) return;  // a dead CQ takes nothing more
  if (dev.pers.cq_overflow == CqOverflow::kLoseEach) {
    dev.raise(AsyncEventType::CQ_ERR, static_cast<uint32_t>(st_.id));
    return;
  }
  overflowed_ = true;
  dev.raise(AsyncEventType::CQ_ERR, static_cast<uint32_t>(st_.id));
  std::vector<QpCore*> users;
  for (const auto& [qpn, core] : dev.qp_table) {
    if (core->uses_cq(this)) users.push_back(core);
  }
  for (QpCore* core : users) core->to_error("CQ overflow");
}

// ---------------------------------------------------------------- SRQ

ModelSrq::ModelSrq(ModelContext& ctx, ModelPd& pd, const SrqInitAttr& attr, uint32_t srqn,
                   ModelCq* cq, std::shared_ptr<XrcdCore> xrcd)
    : ModelObject(ctx.state_of(), "srq"),
      ctx_(ctx),
      pd_(&pd),
      cq_(cq),
      xrcd_(std::move(xrcd)),
      srqn_(srqn),
      max_wr_(attr.max_wr),
      max_sge_(attr.max_sge),
      limit_(attr.srq_limit) {
  ++pd_->usecnt;
  if (cq_) ++cq_->usecnt;
  if (xrcd_) ++xrcd_->srqs;
  ctx_.dev().srq_table[srqn_] = this;
}

void ModelSrq::post_recv(const RecvWr& wr) {
  enter("ibv_post_srq_recv");
  if (ctx_.dead()) throw Error("ibv_post_srq_recv", EIO, "device fatal");
  if (wr.sg_list.size() > max_sge_) throw Error("ibv_post_srq_recv", EINVAL, "too many SGEs");
  if (wqes_.size() >= max_wr_) throw Error("ibv_post_srq_recv", ENOMEM, st_.label + ": SRQ full");
  wqes_.push_back(wr);
  env().record_fields(
      st_.host, st_.label, "post",
      {{"queue", "srq"}, {"wr_id", wr.wr_id}, {"signaled", true}, {"srq_num", srqn_}});
}

void ModelSrq::arm_limit(uint32_t srq_limit) {
  enter("ibv_modify_srq");
  if (srq_limit > max_wr_) throw Error("ibv_modify_srq", EINVAL, "srq_limit above max_wr");
  limit_ = srq_limit;
  env().record_fields(st_.host, st_.label, "verb",
                      {{"verb", "ibv_modify_srq"}, {"srq_limit", srq_limit}});
}

// IBA 10.2.9.2: below the armed limit the SRQ raises SRQ_LIMIT_REACHED once and disarms.
std::optional<RecvWr> ModelSrq::take() {
  if (wqes_.empty()) return std::nullopt;
  RecvWr wr = wqes_.front();
  wqes_.pop_front();
  if (limit_ > 0 && wqes_.size() < limit_) {
    limit_ = 0;
    ctx_.dev().raise(AsyncEventType::SRQ_LIMIT_REACHED, srqn_);
  }
  return wr;
}

void ModelSrq::destroy(TimeNs deadline_ns) {
  enter("ibv_destroy_srq");
  if (usecnt > 0) throw Error("ibv_destroy_srq", EBUSY, st_.label + ": QPs attached");
  const bool acked =
      env().runtime.wait_until([this] { return !st_.live() || ctx_.acked(st_.id); }, deadline_ns);
  st_.check("ibv_destroy_srq");
  if (!acked) {
    throw Error("ibv_destroy_srq", EBUSY,
                st_.label + ": " + std::to_string(ctx_.unacked(st_.id)) +
                    " async events read and not acked");
  }
  release(Release::kVerb);
}

void ModelSrq::release(Release why) {
  if (!st_.live()) return;
  ctx_.dev().srq_table.erase(srqn_);
  ctx_.forget_object(st_.id);
  wqes_.clear();
  --pd_->usecnt;
  if (cq_) --cq_->usecnt;
  st_.end(why, "ibv_destroy_srq", {{"srq_num", srqn_}});
  if (xrcd_) {
    --xrcd_->srqs;
    xrcd_->maybe_destroy();
  }
  ctx_.drop_owned(st_.id);
}

// ---------------------------------------------------------------- XRCD

void XrcdCore::maybe_destroy() {
  if (destroyed || destroying_) return;
  destroying_ = true;
  if (handles == 0 && dev.caps.xrc_tgt_lifetime == XrcTgtLifetime::kXrcd) {
    // Legacy rule: the TGT QPs end with the domain's last reference.
    auto qps = tgt_qps;
    for (auto& [qpn, core] : qps) {
      dev.env.record_fields(dev.host, core->label(), "tgt_qp_destroyed",
                            {{"qp_num", qpn}, {"reason", "xrcd closed"}});
      core->destroy();
    }
  }
  destroying_ = false;
  if (handles > 0 || !tgt_qps.empty() || srqs > 0) return;
  destroyed = true;
  auto it = dev.xrcd_inodes.find(path);
  if (!path.empty() && it != dev.xrcd_inodes.end() && it->second.get() == this)
    dev.xrcd_inodes.erase(it);
  dev.env.record_fields(dev.host, label(), "xrcd_destroyed", {{"path", path}});
}

ModelXrcd::ModelXrcd(ModelContext& ctx, std::shared_ptr<XrcdCore> core)
    : ModelObject(ctx.state_of(), "xrcd"), ctx_(ctx), core_(std::move(core)) {
  ++core_->handles;
}

void ModelXrcd::close() {
  enter("ibv_close_xrcd");
  // Simplification (documented): EBUSY only while this context's own XRC SRQs or TGT QP handles
  // use the domain and this is the context's last handle to it.
  bool own_users = false;
  int own_handles = 0;
  for (const auto& o : ctx_.owned()) {
    if (!o->owned_live()) continue;
    if (auto* s = dynamic_cast<ModelSrq*>(o.get()); s && s->xrcd() == core_.get()) own_users = true;
    if (auto* q = dynamic_cast<ModelQp*>(o.get()); q && q->core()->xrcd == core_) own_users = true;
    if (auto* x = dynamic_cast<ModelXrcd*>(o.get()); x && x->core() == core_) ++own_handles;
  }
  if (own_users && own_handles <= 1) {
    throw Error("ibv_close_xrcd", EBUSY,
                st_.label + ": XRC SRQs or TGT QPs of this context use it");
  }
  release(Release::kVerb);
}

void ModelXrcd::release(Release why) {
  if (!st_.live()) return;
  st_.end(why, "ibv_close_xrcd", {{"xrcd", core_->label()}});
  --core_->handles;
  core_->maybe_destroy();
  ctx_.drop_owned(st_.id);
}

}  // namespace rdmalab::model
