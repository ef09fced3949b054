// A device context (ibv_context) in one process: creates the verbs objects, owns them, and
// holds the uverbs async event queue with the per-object reported/completed counters that
// make destroy wait for acks (semantics.md E).
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

class Device;
class ModelProcess;

class ModelContext final : public ModelObject<Context>,
                           public std::enable_shared_from_this<ModelContext> {
 public:
  ModelContext(Device& dev, ModelProcess& proc);

  const DeviceCaps& caps() const override;
  Gid query_gid(uint8_t port_num, int index) const override;
  PortState query_port(uint8_t port_num) const override;
  std::shared_ptr<Pd> alloc_pd() override;
  std::shared_ptr<Mr> reg_mr(Pd& pd, uint64_t length, uint32_t access) override;
  std::shared_ptr<Cq> create_cq(int cqe) override;
  std::shared_ptr<Srq> create_srq(Pd& pd, const SrqInitAttr& attr) override;
  std::shared_ptr<Srq> create_srq_xrc(Pd& pd, Xrcd& xrcd, Cq& cq, const SrqInitAttr& attr) override;
  std::shared_ptr<Xrcd> open_xrcd(const std::string& path, bool o_creat, bool o_excl) override;
  std::shared_ptr<Qp> create_qp(const QpInitAttr& attr) override;
  std::shared_ptr<Qp> open_qp(Xrcd& xrcd, uint32_t qp_num) override;
  std::optional<AsyncEvent> get_async_event(TimeNs deadline_ns) override;
  void ack_async_event(const AsyncEvent& ev) override;
  void close() override;

  // --- for the model
  Device& dev() const { return dev_; }
  ModelProcess& proc() const { return proc_; }
  // The driver queues an event for this context (the uverbs async fd).
  void push_event(AsyncEvent ev);
  // Unread events of a destroyed object are discarded; its counters go.
  void forget_object(uint64_t object_id);
  bool acked(uint64_t object_id) const;
  uint64_t unacked(uint64_t object_id) const;
  // Releases every object (QPs, SRQs, CQs, MRs, PDs, XRCDs, each newest first), then itself.
  void release_all(Release why);
  std::vector<std::shared_ptr<Owned>> owned() const { return objects_; }
  void drop_owned(uint64_t id);  // an object ended by its own verb
  // Device removal with disassociate_ucontext: every later verb fails with EIO.
  void disassociate() { disassociated_ = true; }
  bool dead() const;  // the device is fatal or this context was disassociated
  std::string dump() const;

 private:
  template <class T>
  std::shared_ptr<T> adopt(std::shared_ptr<T> obj);
  bool disassociated_ = false;
  void check_alive_device(const std::string& verb) const;

  Device& dev_;
  ModelProcess& proc_;
  std::vector<std::shared_ptr<Owned>> objects_;  // creation order
  std::deque<AsyncEvent> events_;
  uint64_t next_event_seq_ = 1;
  struct Counts {
    uint64_t reported = 0;
    uint64_t completed = 0;
  };
  std::map<uint64_t, Counts> counts_;          // by object id
  std::map<uint64_t, uint64_t> read_unacked_;  // event seq -> object id
};

}  // namespace rdmalab::model
