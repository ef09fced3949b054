// PD, MR, CQ, SRQ and XRCD on the model. An MR holds real bytes: SEND, RDMA WRITE and READ
// move them, with lkey/rkey, access and bounds checked as a device checks them.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/objects.h"

namespace rdmalab::model {

class ModelContext;
class Device;
class QpCore;

class ModelPd final : public ModelObject<Pd>, public Owned {
 public:
  explicit ModelPd(ModelContext& ctx);
  void dealloc() override;

  Rank rank() const override { return Rank::kPd; }
  uint64_t owned_id() const override { return st_.id; }
  bool owned_live() const override { return st_.live(); }
  void release(Release why) override;

  ModelContext& ctx() const { return ctx_; }
  int usecnt = 0;  // MRs, QPs, SRQs using it

 private:
  ModelContext& ctx_;
};

class ModelMr final : public ModelObject<Mr>, public Owned {
 public:
  ModelMr(ModelContext& ctx, ModelPd& pd, uint64_t length, uint32_t access, uint32_t key);
  uint32_t lkey() const override { return key_; }
  uint32_t rkey() const override { return key_; }
  uint64_t addr() const override { return 0; }  // model: Sge::addr is an offset into the MR
  uint64_t length() const override { return bytes_.size(); }
  std::vector<uint8_t> read(uint64_t offset, uint64_t len) const override;
  void write(uint64_t offset, const std::vector<uint8_t>& bytes) override;
  void dereg() override;

  Rank rank() const override { return Rank::kMr; }
  uint64_t owned_id() const override { return st_.id; }
  bool owned_live() const override { return st_.live(); }
  void release(Release why) override;

  ModelPd* pd() const { return pd_; }
  uint32_t access() const { return access_; }
  bool in_bounds(uint64_t offset, uint64_t len) const {
    return offset <= bytes_.size() && len <= bytes_.size() - offset;
  }
  uint8_t* data() { return bytes_.data(); }

 private:
  ModelContext& ctx_;
  ModelPd* pd_;
  uint32_t access_;
  uint32_t key_;
  std::vector<uint8_t> bytes_;
};

class ModelCq final : public ModelObject<Cq>, public Owned {
 public:
  ModelCq(ModelContext& ctx, int cqe, int capacity);
  int cqe() const override { return cqe_; }
  std::vector<WorkCompletion> poll(int max) override;
  void destroy(TimeNs deadline_ns) override;

  Rank rank() const override { return Rank::kCq; }
  uint64_t owned_id() const override { return st_.id; }
  bool owned_live() const override { return st_.live(); }
  void release(Release why) override;

  // The hardware writes a CQE; the personality decides what a full CQ does
  // (Personality::cq_overflow).
  void push(const WorkCompletion& wc, const std::string& qp_label);
  size_t depth() const { return entries_.size(); }
  bool overflowed() const { return overflowed_; }
  ModelContext& ctx() const { return ctx_; }
  int usecnt = 0;  // QPs and SRQs using it

 private:
  ModelContext& ctx_;
  int cqe_;       // reported (ibv_cq->cqe)
  int capacity_;  // held before an overflow (Personality::cq_rounding)
  std::deque<WorkCompletion> entries_;
  bool overflowed_ = false;
};

class XrcdCore;

class ModelSrq final : public ModelObject<Srq>, public Owned {
 public:
  ModelSrq(ModelContext& ctx, ModelPd& pd, const SrqInitAttr& attr, uint32_t srqn, ModelCq* cq,
           std::shared_ptr<XrcdCore> xrcd);
  uint32_t srq_num() const override { return srqn_; }
  bool is_xrc() const override { return xrcd_ != nullptr; }
  void post_recv(const RecvWr& wr) override;
  void arm_limit(uint32_t srq_limit) override;
  uint32_t limit() const override { return limit_; }
  uint32_t outstanding() const override { return static_cast<uint32_t>(wqes_.size()); }
  void destroy(TimeNs deadline_ns) override;

  Rank rank() const override { return Rank::kSrq; }
  uint64_t owned_id() const override { return st_.id; }
  bool owned_live() const override { return st_.live(); }
  void release(Release why) override;

  // The responder takes the next receive WQE; raises SRQ_LIMIT_REACHED when armed and below.
  std::optional<RecvWr> take();
  ModelPd* pd() const { return pd_; }
  ModelCq* cq() const { return cq_; }  // XRC SRQs complete here
  XrcdCore* xrcd() const { return xrcd_.get(); }
  ModelContext& ctx() const { return ctx_; }
  int usecnt = 0;  // QPs attached

 private:
  ModelContext& ctx_;
  ModelPd* pd_;
  ModelCq* cq_;
  std::shared_ptr<XrcdCore> xrcd_;
  uint32_t srqn_;
  uint32_t max_wr_;
  uint32_t max_sge_;
  uint32_t limit_;
  std::deque<RecvWr> wqes_;
};

// The XRC domain itself, shared by inode among the processes of a host (semantics.md D).
// Lives while a handle, a TGT QP or an XRC SRQ uses it.
class XrcdCore {
 public:
  XrcdCore(Device& dev, std::string path, uint64_t id) : dev(dev), path(std::move(path)), id(id) {}
  Device& dev;
  std::string path;  // "" = no inode
  uint64_t id;
  int handles = 0;  // open references (ibv_open_xrcd)
  int srqs = 0;
  std::map<uint32_t, std::shared_ptr<QpCore>> tgt_qps;  // by QPN
  bool destroyed = false;

  std::string label() const { return "xrcd:" + std::to_string(id); }
  // Drops the domain once nothing uses it (under kXrcd the last handle also ends its TGT QPs).
  void maybe_destroy();

 private:
  bool destroying_ = false;
};

class ModelXrcd final : public ModelObject<Xrcd>, public Owned {
 public:
  ModelXrcd(ModelContext& ctx, std::shared_ptr<XrcdCore> core);
  void close() override;

  Rank rank() const override { return Rank::kXrcd; }
  uint64_t owned_id() const override { return st_.id; }
  bool owned_live() const override { return st_.live(); }
  void release(Release why) override;

  const std::shared_ptr<XrcdCore>& core() const { return core_; }
  ModelContext& ctx() const { return ctx_; }

 private:
  ModelContext& ctx_;
  std::shared_ptr<XrcdCore> core_;
};

}  // namespace rdmalab::model
