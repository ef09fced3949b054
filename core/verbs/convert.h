// Conversions between the engine's vocabulary (rdmalab/types.h) and libibverbs structs. Mask
// bits and WC statuses have ibv's values by design; the rest is mapped field by field.
#pragma once

#include <infiniband/verbs.h>

#include <optional>
#include <string>
#include <vector>

#include "rdmalab/driver_facts.h"
#include "rdmalab/types.h"
#include "rdmalab/verbs.h"

namespace rdmalab::verbs {

ibv_qp_state to_ibv(QpState s);
QpState from_ibv(ibv_qp_state s);
ibv_qp_type to_ibv(QpType t);
ibv_mtu mtu_to_ibv(uint32_t bytes);  // EINVAL for a size that is not 256..4096
uint32_t mtu_from_ibv(ibv_mtu m);
PortState from_ibv(ibv_port_state s);
Gid from_ibv(const ibv_gid& g);

ibv_ah_attr to_ibv(const AhAttr& a);
AhAttr from_ibv(const ibv_ah_attr& a);

// The fields of attr that mask selects; the mask itself passes unchanged.
ibv_qp_attr to_ibv(const QpAttr& attr, uint32_t mask);
QpAttr from_ibv(const ibv_qp_attr& attr);
ibv_qp_cap to_ibv(const QpCap& cap);

// A send WR and the SGEs it points at, kept together so the pointers stay valid.
struct IbvSendWr {
  ibv_send_wr wr{};
  std::vector<ibv_sge> sge;
  IbvSendWr() = default;
  IbvSendWr(const IbvSendWr&) = delete;
  IbvSendWr& operator=(const IbvSendWr&) = delete;
};
struct IbvRecvWr {
  ibv_recv_wr wr{};
  std::vector<ibv_sge> sge;
  IbvRecvWr() = default;
  IbvRecvWr(const IbvRecvWr&) = delete;
  IbvRecvWr& operator=(const IbvRecvWr&) = delete;
};

// imm_data travels in network order on the wire; the engine keeps it in host order.
// ah: the address handle for a UD send (nullptr otherwise).
void to_ibv(const SendWr& in, QpType qp_type, ibv_ah* ah, IbvSendWr& out);
void to_ibv(const RecvWr& in, IbvRecvWr& out);
ibv_wr_opcode to_ibv(WrOpcode o);
WorkCompletion from_ibv(const ibv_wc& wc);

// nullopt for events the engine does not model (IBV_EVENT_WQ_FATAL, ...).
std::optional<AsyncEventType> from_ibv(ibv_event_type t);

// What the engine knows of a device. node_type/link_layer choose the transport: RNIC ->
// iWARP, Ethernet link layer -> RoCE, else IB.
struct DeviceFacts {
  std::string name;
  std::string driver;  // personality
  ibv_node_type node_type = IBV_NODE_CA;
  uint8_t port1_link_layer = IBV_LINK_LAYER_INFINIBAND;
  ibv_device_attr_ex attr{};
  KernelRelease kernel;  // the running kernel (running_kernel()); {0, 0}: unknown
};
DeviceCaps caps_from(const DeviceFacts& f);
// A release as uname -r gives it ("6.1.0-56-amd64") as major.minor; {0, 0} if it does not parse.
KernelRelease kernel_release_of(const char* release);
// The running kernel's release (uname(2)); {0, 0} where unknown.
KernelRelease running_kernel();
Transport transport_of(ibv_node_type node_type, uint8_t link_layer);

}  // namespace rdmalab::verbs
