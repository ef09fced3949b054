#include "model/device.h"

#include <algorithm>

#include "model/cm_ib.h"
#include "model/cm_iw.h"
#include "model/context.h"
#include "model/qp.h"
#include "model/resources.h"

namespace rdmalab::model {

Device::Device(Env& env_in, Fabric& fabric_in, const Personality& p, std::string host_in,
               int host_index)
    : env(env_in),
      fabric(fabric_in),
      pers(p),
      caps(p.caps),
      host(std::move(host_in)),
      lid(static_cast<uint16_t>(host_index + 1)),
      next_qpn_(p.first_qpn) {
  caps.name = "model-" + p.caps.personality + "0";
  caps.node_guid = p.guid_base + static_cast<uint64_t>(host_index + 1);
  // Link-local GID: fe80::/64 and the node GUID as the interface id.
  gid.raw[0] = 0xfe;
  gid.raw[1] = 0x80;
  for (int i = 0; i < 8; ++i) gid.raw[8 + i] = static_cast<uint8_t>(caps.node_guid >> (56 - 8 * i));
  if (caps.transport == Transport::iWARP) {
    iw_cm = std::make_unique<IwCm>(*this);
  } else {
    ib_cm = std::make_unique<IbCm>(*this);
  }
}

Device::~Device() = default;

void Device::reset_after_reboot() {
  for (const auto& [seq, e] : eq_) env.runtime.cancel(e.timer);
  eq_.clear();
  qp_table.clear();
  srq_table.clear();
  mr_table.clear();
  cq_table.clear();
  xrcd_inodes.clear();
  contexts.clear();
  free_qpns_.clear();
  next_qpn_ = pers.first_qpn;
  next_srqn_ = 1;
  next_key_ = 0x1000;
  port_up = true;
  fatal = false;
}

uint32_t Device::alloc_qpn() {
  if (caps.qpn_policy == QpnPolicy::kLifo && !free_qpns_.empty()) {
    const uint32_t qpn = free_qpns_.back();
    free_qpns_.pop_back();
    return qpn;
  }
  // Cyclic: never hand out a number still in the table.
  for (;;) {
    const uint32_t qpn = next_qpn_;
    next_qpn_ = next_qpn_ >= pers.max_qpn ? pers.first_qpn : next_qpn_ + 1;
    if (qp_table.count(qpn) == 0) return qpn;
  }
}

void Device::free_qpn(uint32_t qpn) {
  if (caps.qpn_policy == QpnPolicy::kLifo) free_qpns_.push_back(qpn);
}

ModelMr* Device::find_mr(uint32_t key) const {
  auto it = mr_table.find(key);
  return it == mr_table.end() ? nullptr : it->second;
}

void Device::raise(AsyncEventType type, uint32_t number, TimeNs driver_delay_ns) {
  if (!caps.raises_event(type)) return;
  const uint64_t seq = next_eqe_++;
  const TimeNs now = env.runtime.now_ns();
  const uint64_t timer = env.runtime.schedule_after(std::max<TimeNs>(0, driver_delay_ns),
                                                    [this, seq] { handle_eqe(seq); });
  eq_.emplace(seq, Eqe{type, number, now, timer});
}

void Device::handle_eqe(uint64_t seq) {
  auto it = eq_.find(seq);
  if (it == eq_.end()) return;
  const Eqe e = it->second;
  eq_.erase(it);
  dispatch(e);
}

void Device::drain_eqes_for_qpn(uint32_t qpn) {
  std::vector<uint64_t> seqs;
  for (const auto& [seq, e] : eq_) {
    if (affiliation(e.type) == ObjectKind::QP && e.number == qpn) seqs.push_back(seq);
  }
  for (uint64_t seq : seqs) {
    env.runtime.cancel(eq_.at(seq).timer);
    handle_eqe(seq);
  }
}

void Device::to_every_context(AsyncEvent ev) {
  for (ModelContext* ctx : std::vector<ModelContext*>(contexts)) ctx->push_event(ev);
}

// The driver's event handler: look the number up now, as mlx5_get_rsc / mana_get_qp_ref do.
void Device::dispatch(const Eqe& e) {
  AsyncEvent ev;
  ev.type = e.type;
  ev.kind = affiliation(e.type);
  nlohmann::json data = {
      {"event", std::string(to_string(e.type))}, {"number", e.number}, {"raised_ns", e.raised_ns}};
  auto dropped = [&] { env.record(host, "device", "eqe_dropped", data); };
  switch (ev.kind) {
    case ObjectKind::QP: {
      auto it = qp_table.find(e.number);
      if (it == qp_table.end()) return dropped();
      QpCore* core = it->second;
      data["qp_num"] = core->qpn;
      env.record(host, core->label(), "async_event", data);
      ev.qp_num = core->qpn;
      for (ModelQp* h : std::vector<ModelQp*>(core->handles)) {  // each open handle gets a copy
        ev.object_id = h->id();
        h->ctx().push_event(ev);
      }
      if (e.type == AsyncEventType::COMM_EST && ib_cm) ib_cm->on_comm_est_qp(e.number);
      return;
    }
    case ObjectKind::SRQ: {
      auto it = srq_table.find(e.number);
      if (it == srq_table.end()) return dropped();
      env.record(host, it->second->label(), "async_event", data);
      ev.object_id = it->second->id();
      ev.srq_num = e.number;
      it->second->ctx().push_event(ev);
      return;
    }
    case ObjectKind::CQ: {
      auto it = cq_table.find(e.number);
      if (it == cq_table.end()) return dropped();
      env.record(host, it->second->label(), "async_event", data);
      ev.object_id = it->second->id();
      it->second->ctx().push_event(ev);
      return;
    }
    case ObjectKind::PORT:
      ev.port_num = static_cast<uint8_t>(e.number);
      env.record(host, "port:" + std::to_string(e.number), "async_event", data);
      return to_every_context(ev);
    default:
      env.record(host, "device", "async_event", data);
      return to_every_context(ev);
  }
}

void Device::set_port(bool up) {
  if (port_up == up) return;
  port_up = up;
  raise(up ? AsyncEventType::PORT_ACTIVE : AsyncEventType::PORT_ERR, 1);
}

void Device::make_fatal() {
  if (fatal) return;
  fatal = true;
  std::vector<QpCore*> cores;
  for (const auto& [qpn, core] : qp_table) cores.push_back(core);
  for (QpCore* core : cores) core->device_fatal();
  raise(AsyncEventType::DEVICE_FATAL, 0);
}

void Device::remove() {
  if (caps.disassociates) {
    for (ModelContext* ctx : contexts) ctx->disassociate();
    env.record_fields(host, "device", "device_disassociate", {{"contexts", contexts.size()}});
    make_fatal();  // ib_uverbs_free_hw_resources: RDMA_REMOVE_DRIVER_REMOVE -> DEVICE_FATAL
    removal = Removal::kRemoved;
    env.record_fields(host, "device", "device_removed", {{"device", caps.name}});
    return;
  }
  removal = Removal::kPending;
  env.record_fields(host, "device", "device_removal_pending",
                    {{"device", caps.name}, {"contexts", contexts.size()}});
  context_closed();
}

void Device::context_closed() {
  if (removal != Removal::kPending || !contexts.empty()) return;
  removal = Removal::kRemoved;  // wait_for_completion(&uverbs_dev->comp) returns
  fatal = true;                 // (model) the device is gone: no packets, no verbs
  env.record_fields(host, "device", "device_removed", {{"device", caps.name}});
}

// The disassociated contexts stay dead (ModelContext::disassociated); the new device serves
// new ones. (model) The QPN allocator and tables carry on.
void Device::add_back() {
  removal = Removal::kNone;
  fatal = false;
  port_up = true;
  env.record_fields(host, "device", "device_added", {{"device", caps.name}});
}

Device* Device::resolve(const AhAttr& ah) const {
  const bool by_gid = ah.dgid != Gid{};
  for (const auto& [name, dev] : env.devices) {
    if (by_gid ? dev->gid == ah.dgid : dev->lid == ah.dlid) return dev;
  }
  return nullptr;
}

void Device::send(Frame f, const AhAttr& ah) {
  Device* dst = resolve(ah);
  f.pkt.src_host = host;
  f.pkt.qp_type = f.qp_type;  // the BTH's transport, for the wire-fault rules
  if (dst == nullptr) {
    env.record_fields(host, "fabric", "unroutable",
                      {{"opcode", f.pkt.opcode}, {"dest_qpn", f.pkt.dest_qpn}});
    return;
  }
  f.pkt.dst_host = dst->host;
  f.src_gid_host = host;
  auto frame = std::make_shared<const Frame>(std::move(f));
  Env* e = &env;
  fabric.send(frame->pkt, [e, frame](const Packet& p) {
    if (Device* d = e->device(p.dst_host)) {
      Frame copy = *frame;
      copy.pkt = p;
      d->on_frame(copy);
    }
  });
}

// A packet to a QPN with no QP is silently dropped: the sender ends in RETRY_EXC_ERR.
void Device::on_frame(const Frame& f) {
  if (fatal) return;
  auto it = qp_table.find(f.pkt.dest_qpn);
  if (it == qp_table.end()) return;
  std::shared_ptr<QpCore> core = it->second->shared_from_this();
  core->on_frame(f);
}

}  // namespace rdmalab::model
