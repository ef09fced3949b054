// A device context (ibv_context) over libibverbs: creates the verbs objects, keeps a weak
// list of them for close(), and owns the async event thread (events.h).
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "verbs/convert.h"
#include "verbs/objects.h"

namespace rdmalab::verbs {

// The driver behind a device: the sysfs device's driver link (mlx5_core, ...), else the
// device name without its index ("rxe0" -> "rxe", "siw_eth0" -> "siw").
std::string driver_name(const std::string& device_name, const std::string& sysfs_root);

// ibv_query_device_ex and port 1 of an open context, as DeviceCaps.
DeviceCaps query_caps(ibv_context* ctx, const std::string& sysfs_root);

class VerbsContext final : public Context {
 public:
  VerbsContext(ibv_device* dev, History* history, std::string host);
  // A context librdmacm opened for its ids (rdma_cm_id.verbs): used, never closed, by us.
  VerbsContext(ibv_context* borrowed, History* history, std::string host);
  // Objects still held elsewhere keep the device open through their ContextState.
  ~VerbsContext() override = default;

  uint64_t id() const override { return id_; }
  bool destroyed() const override { return !st_->ctx.live(); }
  std::string label() const override { return label_; }
  Owner owner() const override { return st_->owner(); }

  const DeviceCaps& caps() const override { return st_->caps; }
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
  void interrupt_get_async_event() override;
  void ack_async_event(const AsyncEvent& ev) override;
  void close() override;

  // rdma_create_qp on id, owned like create_qp's QPs.
  std::shared_ptr<Qp> create_cm_qp(const QpInitAttr& attr, const CmBinding& cm);

  static constexpr const char* kSysfsRoot = "/sys/class/infiniband";

 private:
  template <class T>
  std::shared_ptr<T> adopt(std::shared_ptr<T> obj);
  void opened(ibv_context* ctx);

  std::shared_ptr<ContextState> st_;
  uint64_t id_;
  std::string label_;
  std::mutex mu_;
  std::vector<std::weak_ptr<Releasable>> owned_;  // creation order
};

}  // namespace rdmalab::verbs
