// One model RDMA device (one per host): QPN and SRQN allocation per personality, the driver's
// QPN table, the event queue (EQ) between "hardware" and driver, the port, and async event
// delivery to the contexts opened on it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/env.h"
#include "model/fabric.h"
#include "model/personality.h"
#include "model/transport.h"

namespace rdmalab::model {

class IbCm;
class IwCm;
class ModelContext;
class ModelCq;
class ModelMr;
class ModelSrq;
class QpCore;
class XrcdCore;

class Device {
 public:
  Device(Env& env, Fabric& fabric, const Personality& p, std::string host, int host_index);
  ~Device();

  Env& env;
  Fabric& fabric;
  const Personality pers;
  DeviceCaps caps;
  const std::string host;
  Gid gid;
  uint16_t lid;
  bool port_up = true;
  bool fatal = false;
  bool host_down = false;  // ModelLab::reboot: the fabric drops packets to and from it
  // rdma link delete (ModelLab::rdma_link_delete): kPending while open user contexts block it
  // (a provider without disassociate_ucontext), kRemoved once it is done; unlisted meanwhile.
  enum class Removal { kNone, kPending, kRemoved };
  Removal removal = Removal::kNone;

  // The host's CM (one device per host): the IB CM on IB/RoCE, the iWARP CM on iWARP.
  std::unique_ptr<IbCm> ib_cm;
  std::unique_ptr<IwCm> iw_cm;

  // --- QPNs and the driver's tables (raw pointers: entries are removed before objects end)
  uint32_t alloc_qpn();
  void free_qpn(uint32_t qpn);
  uint32_t alloc_srqn() { return next_srqn_++; }
  std::map<uint32_t, QpCore*> qp_table;
  std::map<uint32_t, ModelSrq*> srq_table;
  std::map<uint32_t, ModelMr*> mr_table;  // by key (lkey == rkey)
  std::map<uint64_t, ModelCq*> cq_table;  // by engine id (what inject_async_event names)
  std::map<std::string, std::shared_ptr<XrcdCore>> xrcd_inodes;
  std::vector<ModelContext*> contexts;  // open contexts, in open order
  uint32_t alloc_key() { return next_key_++; }
  ModelMr* find_mr(uint32_t key) const;

  // --- events: the hardware writes an EQE now; the driver handles it after driver_delay_ns,
  // looking the number up in its tables. Events the personality never raises are not made.
  void raise(AsyncEventType type, uint32_t number, TimeNs driver_delay_ns = kDriverDelayNs);
  // Destroy path: EQEs still pending for this QPN are handled now; with the QP already out of
  // the table they find nothing and are dropped ("eqe_dropped").
  void drain_eqes_for_qpn(uint32_t qpn);
  size_t pending_eqes() const { return eq_.size(); }

  // --- faults
  void set_port(bool up);
  void make_fatal();
  // uverbs_main.c ib_uverbs_remove_one (Q3): with disassociate_ucontext every user context is
  // disassociated (DEVICE_FATAL on its async fd, QPs dead) and the removal completes; without,
  // nothing is raised and it waits until every context on the device is closed.
  void remove();
  void context_closed();  // a context went: a pending removal may complete
  void add_back();        // rdma link add: a fresh device with the same name and GUID
  // Reboot, once every process is gone: the tables and allocators start again (the QPN
  // allocator at its first QPN), pending EQEs go; node GUID, GID and LID stay.
  void reset_after_reboot();

  // --- wire
  void send(Frame f, const AhAttr& ah);
  void on_frame(const Frame& f);
  Device* resolve(const AhAttr& ah) const;

 private:
  struct Eqe {
    AsyncEventType type;
    uint32_t number;
    TimeNs raised_ns;
    uint64_t timer;
  };
  void handle_eqe(uint64_t seq);
  void dispatch(const Eqe& e);
  void to_every_context(AsyncEvent ev);

  std::vector<uint32_t> free_qpns_;  // kLifo: most recently freed last
  uint32_t next_qpn_;
  uint32_t next_srqn_ = 1;
  uint32_t next_key_ = 0x1000;
  uint64_t next_eqe_ = 1;
  std::map<uint64_t, Eqe> eq_;
};

}  // namespace rdmalab::model
