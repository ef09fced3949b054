// The verbs objects of one device context, over libibverbs. Each holds the context's shared
// state (so the device stays open while any object lives) and the objects it was created
// from (so a PD outlives its MRs and a CQ its QPs, as the kernel requires).
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "rdmalab/history.h"
#include "rdmalab/verbs.h"
#include "verbs/events.h"
#include "verbs/handles.h"

namespace rdmalab::verbs {

uint64_t new_object_id();  // process-wide, never reused

// What a context and every object created from it share.
struct ContextState {
  ContextState(History* h, std::string host_name)
      : history(h), host(std::move(host_name)), events(h, host) {}
  History* history;
  std::string host;
  uint64_t ctx_id = 0;  // the VerbsContext's engine id and label (Owner of its objects)
  std::string ctx_label;
  Handle<ibv_context> ctx;  // declared before events: closed after the event thread stops
  EventQueue events;
  DeviceCaps caps;
  void record(const std::string& object, const std::string& kind, nlohmann::json data) const {
    if (history != nullptr) history->record(host, object, kind, std::move(data));
  }
  Owner owner() const { return {history, ctx_id, ctx_label, host}; }
  // QPN -> QP label, so a completion is recorded under its QP as the model does.
  void name_qp(uint32_t qp_num, const std::string& label) {
    std::lock_guard<std::mutex> lock(qp_mu_);
    qp_labels_[qp_num] = label;
  }
  void unname_qp(uint32_t qp_num, const std::string& label) {
    std::lock_guard<std::mutex> lock(qp_mu_);
    if (auto it = qp_labels_.find(qp_num); it != qp_labels_.end() && it->second == label) {
      qp_labels_.erase(it);
    }
  }
  std::string qp_label(uint32_t qp_num, const std::string& fallback) const {
    std::lock_guard<std::mutex> lock(qp_mu_);
    auto it = qp_labels_.find(qp_num);
    return it == qp_labels_.end() ? fallback : it->second;
  }

 private:
  mutable std::mutex qp_mu_;
  std::map<uint32_t, std::string> qp_labels_;
};

// What close() releases, in rank order (uverbs: QPs first, XRCDs last).
class Releasable {
 public:
  virtual ~Releasable() = default;
  virtual int rank() const = 0;
  // Ends the object without waiting for event acks (ibv_close_device, process exit).
  virtual void release() noexcept = 0;
};

template <class Base>
class VerbsObject : public Base, public Releasable {
 public:
  VerbsObject(std::shared_ptr<ContextState> st, const std::string& prefix)
      : st_(std::move(st)), id_(new_object_id()), label_(prefix + ":" + std::to_string(id_)) {}
  uint64_t id() const override { return id_; }
  std::string label() const override { return label_; }
  Owner owner() const override { return st_->owner(); }
  ContextState& context_state() const { return *st_; }

 protected:
  void recorded(const std::string& verb, nlohmann::json data = nlohmann::json::object()) const {
    data["verb"] = verb;
    st_->record(label_, "verb", std::move(data));
  }
  std::shared_ptr<ContextState> st_;
  uint64_t id_;
  std::string label_;
};

class VerbsPd final : public VerbsObject<Pd>, public std::enable_shared_from_this<VerbsPd> {
 public:
  explicit VerbsPd(std::shared_ptr<ContextState> st);
  bool destroyed() const override { return !pd_.live(); }
  void dealloc() override;
  int rank() const override { return 4; }
  void release() noexcept override;
  ibv_pd* get(const std::string& verb) const { return pd_.get(verb); }

 private:
  Handle<ibv_pd> pd_;
};

class VerbsMr final : public VerbsObject<Mr> {
 public:
  VerbsMr(std::shared_ptr<ContextState> st, std::shared_ptr<VerbsPd> pd, uint64_t length,
          uint32_t access);
  bool destroyed() const override { return !mr_.live(); }
  uint32_t lkey() const override { return mr_.get("ibv_mr.lkey")->lkey; }
  uint32_t rkey() const override { return mr_.get("ibv_mr.rkey")->rkey; }
  uint64_t addr() const override;
  uint64_t length() const override { return mr_.length(); }
  std::vector<uint8_t> read(uint64_t offset, uint64_t len) const override;
  void write(uint64_t offset, const std::vector<uint8_t>& bytes) override;
  void dereg() override;
  int rank() const override { return 3; }
  void release() noexcept override;

 private:
  std::shared_ptr<VerbsPd> pd_;
  MrBuffer mr_;
};

class VerbsCq final : public VerbsObject<Cq>, public std::enable_shared_from_this<VerbsCq> {
 public:
  VerbsCq(std::shared_ptr<ContextState> st, int cqe);
  ~VerbsCq() override { release(); }
  bool destroyed() const override { return !cq_.live(); }
  int cqe() const override { return cq_.get("ibv_cq.cqe")->cqe; }
  std::vector<WorkCompletion> poll(int max) override;
  void destroy(TimeNs deadline_ns) override;
  int rank() const override { return 2; }
  void release() noexcept override;
  ibv_cq* get(const std::string& verb) const { return cq_.get(verb); }

 private:
  Handle<ibv_cq> cq_;
};

class VerbsXrcd final : public VerbsObject<Xrcd>, public std::enable_shared_from_this<VerbsXrcd> {
 public:
  VerbsXrcd(std::shared_ptr<ContextState> st, const std::string& path, bool o_creat, bool o_excl);
  bool destroyed() const override { return !xrcd_.live(); }
  void close() override;
  int rank() const override { return 5; }
  void release() noexcept override;
  ibv_xrcd* get(const std::string& verb) const { return xrcd_.get(verb); }

 private:
  Handle<ibv_xrcd> xrcd_;
};

class VerbsSrq final : public VerbsObject<Srq>, public std::enable_shared_from_this<VerbsSrq> {
 public:
  // Basic SRQ (xrcd and cq null) or XRC SRQ.
  VerbsSrq(std::shared_ptr<ContextState> st, std::shared_ptr<VerbsPd> pd,
           std::shared_ptr<VerbsXrcd> xrcd, std::shared_ptr<VerbsCq> cq, const SrqInitAttr& attr);
  ~VerbsSrq() override { release(); }
  bool destroyed() const override { return !srq_.live(); }
  uint32_t srq_num() const override { return srq_num_; }
  bool is_xrc() const override { return xrcd_ != nullptr; }
  void post_recv(const RecvWr& wr) override;
  void arm_limit(uint32_t srq_limit) override;
  uint32_t limit() const override;
  uint32_t outstanding() const override;
  void destroy(TimeNs deadline_ns) override;
  int rank() const override { return 1; }
  void release() noexcept override;
  ibv_srq* get(const std::string& verb) const { return srq_.get(verb); }

 private:
  std::shared_ptr<VerbsPd> pd_;
  std::shared_ptr<VerbsXrcd> xrcd_;
  std::shared_ptr<VerbsCq> cq_;
  Handle<ibv_srq> srq_;
  uint32_t srq_num_ = 0;
};

// A QP created by rdma_create_qp on an rdma_cm id: destroyed through rdma_destroy_qp while the
// id lives (it clears id->qp, which rdma_disconnect reads), by ibv_destroy_qp after.
struct CmBinding {
  rdma_cm_id* id = nullptr;
  std::shared_ptr<std::atomic<bool>> id_live;
};

class VerbsQp final : public VerbsObject<Qp> {
 public:
  // ibv_create_qp / ibv_create_qp_ex (XRC types).
  VerbsQp(std::shared_ptr<ContextState> st, const QpInitAttr& attr,
          const CmBinding& cm = CmBinding{});
  // ibv_open_qp.
  VerbsQp(std::shared_ptr<ContextState> st, std::shared_ptr<VerbsXrcd> xrcd, uint32_t qp_num);
  ~VerbsQp() override { release(); }
  bool destroyed() const override { return !qp_.live(); }
  uint32_t qp_num() const override { return qp_num_; }
  QpType qp_type() const override { return type_; }
  QpState state() const override;
  void modify(const QpAttr& attr, uint32_t attr_mask) override;
  QpAttr query() const override;
  void post_send(const SendWr& wr) override;
  void post_recv(const RecvWr& wr) override;
  void destroy(TimeNs deadline_ns) override;
  bool is_open_handle() const override { return open_handle_; }
  const DeviceCaps& device_caps() const override { return context_state().caps; }
  int rank() const override { return 0; }
  void release() noexcept override;

 private:
  ibv_ah* ah_for(const AhAttr& a);
  void create_basic(const ibv_qp_init_attr_ex& ex, const CmBinding& cm);
  void registered();

  QpType type_;
  bool open_handle_ = false;
  uint32_t qp_num_ = 0;
  std::vector<std::shared_ptr<Object>> deps_;  // PD, CQs, SRQ, XRCD
  std::shared_ptr<VerbsPd> pd_;
  Handle<ibv_qp> qp_;
  // UD address handles, kept until the QP goes: a posted WR may still use one.
  std::map<std::tuple<std::array<uint8_t, 16>, uint16_t, uint8_t, uint8_t, uint8_t>, Handle<ibv_ah>>
      ahs_;
};

// dynamic_cast to the verbs class or Error(verb, EINVAL): an object of another backend.
template <class T, class U>
std::shared_ptr<T> as_verbs(const std::shared_ptr<U>& p, const std::string& verb) {
  if (!p) return nullptr;
  auto v = std::dynamic_pointer_cast<T>(p);
  if (!v) throw Error(verb, EINVAL, p->label() + " is not a verbs-backend object");
  return v;
}

}  // namespace rdmalab::verbs
