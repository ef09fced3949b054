// Names of protocol values as the specifications spell them, and the one-line frame summary
// the history records.
#include <arpa/inet.h>

#include <cstdio>
#include <utility>

#include "faults/frame.h"

namespace rdmalab::faults {
namespace {

std::string hex(unsigned v, int width) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", width, v);
  return buf;
}

}  // namespace

const char* stop_name(Stop s) {
  switch (s) {
    case Stop::kComplete:
      return "complete";
    case Stop::kTruncated:
      return "truncated";
    case Stop::kBadHeader:
      return "bad_header";
    case Stop::kNotParsed:
      return "not_parsed";
    case Stop::kUnaligned:
      return "unaligned";
  }
  return "?";
}

const char* bth_transport_name(uint8_t opcode) {
  switch (opcode >> 5) {
    case 0:
      return "RC";
    case 1:
      return "UC";
    case 2:
      return "RD";
    case 3:
      return "UD";
    case 4:
      return "CNP";
    case 5:
      return "XRC";
    default:
      return nullptr;
  }
}

// AETH syndrome: bits 6-5 ACK (00), RNR NAK (01), NAK (11); a NAK's code in bits 4-0 (rxe_hdr.h).
const char* aeth_syndrome_name(uint8_t syndrome) {
  switch (syndrome & 0xE0) {  // bit 7 is reserved: a syndrome with it set has no type
    case 0x00:
      return "ACK";
    case 0x20:
      return "RNR_NAK";
    case 0x60:
      switch (syndrome & 0x1F) {
        case 0:
          return "NAK_SEQ";
        case 1:
          return "NAK_INV_REQ";
        case 2:
          return "NAK_REM_ACCESS";
        case 3:
          return "NAK_REM_OP";
        case 4:
          return "NAK_INV_RD_REQ";
        default:
          return nullptr;
      }
    default:
      return nullptr;
  }
}

// RFC 5040 4.2 (siw iwarp.h enum rdma_opcode).
const char* rdmap_opcode_name(uint8_t opcode) {
  switch (opcode) {
    case 0x0:
      return "RDMA_WRITE";
    case 0x1:
      return "RDMA_READ_REQUEST";
    case 0x2:
      return "RDMA_READ_RESPONSE";
    case 0x3:
      return "SEND";
    case 0x4:
      return "SEND_WITH_INVALIDATE";
    case 0x5:
      return "SEND_WITH_SE";
    case 0x6:
      return "SEND_WITH_SE_AND_INVALIDATE";
    case 0x7:
      return "TERMINATE";
    default:
      return nullptr;
  }
}

std::string tcp_flags_string(uint8_t flags) {
  static constexpr std::pair<uint8_t, const char*> kNames[] = {
      {tcp_flag::FIN, "FIN"}, {tcp_flag::SYN, "SYN"}, {tcp_flag::RST, "RST"},
      {tcp_flag::PSH, "PSH"}, {tcp_flag::ACK, "ACK"}, {tcp_flag::URG, "URG"},
      {tcp_flag::ECE, "ECE"}, {tcp_flag::CWR, "CWR"}};
  std::string s;
  for (const auto& [bit, name] : kNames) {
    if (!(flags & bit)) continue;
    if (!s.empty()) s += '|';
    s += name;
  }
  return s;
}

std::string mac_string(const Mac& m) {
  char buf[18];
  std::snprintf(buf, sizeof buf, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4],
                m[5]);
  return buf;
}

std::string ip_string(const Ip& ip, bool src) {
  char buf[INET6_ADDRSTRLEN] = {};
  const auto& a = src ? ip.src : ip.dst;
  inet_ntop(ip.version == 6 ? AF_INET6 : AF_INET, a.data(), buf, sizeof buf);
  return buf;
}

nlohmann::json summary(const Frame& f) {
  nlohmann::json j = {{"len", f.len}};
  if (f.eth) {
    j["src"] = mac_string(f.eth->src);
    j["dst"] = mac_string(f.eth->dst);
    j["ethertype"] = hex(f.eth->ethertype, 4);
  }
  if (f.ip) {
    j["ip_src"] = ip_string(*f.ip, true);
    j["ip_dst"] = ip_string(*f.ip, false);
  }
  if (f.bth) {
    const char* op = bth_opcode_name(f.bth->opcode);
    j["proto"] = "roce";
    j["opcode"] = op != nullptr ? op : hex(f.bth->opcode, 2);
    if (const char* t = bth_transport_name(f.bth->opcode)) j["transport"] = t;
    j["dest_qpn"] = f.bth->dest_qpn;
    j["psn"] = f.bth->psn;
    j["ack_req"] = f.bth->ack_req;
  }
  if (f.deth) j["src_qpn"] = f.deth->src_qpn;
  if (f.aeth) {
    const char* s = aeth_syndrome_name(f.aeth->syndrome);
    j["syndrome"] = s != nullptr ? s : hex(f.aeth->syndrome, 2);
    j["msn"] = f.aeth->msn;
  }
  if (f.mad) {
    j["mgmt_class"] = f.mad->mgmt_class;
    j["mad_attr_id"] = f.mad->attr_id;
    if (f.mad->mgmt_class == kMgmtClassCm)
      if (const char* cm = cm_attr_name(f.mad->attr_id)) j["cm"] = cm;
    if (f.mad->local_comm_id) j["local_comm_id"] = *f.mad->local_comm_id;
    if (f.mad->remote_comm_id) j["remote_comm_id"] = *f.mad->remote_comm_id;
    if (f.mad->local_qpn) j["local_qpn"] = *f.mad->local_qpn;
    if (f.mad->remote_qpn) j["remote_qpn"] = *f.mad->remote_qpn;
    if (f.mad->rej_reason) j["rej_reason"] = *f.mad->rej_reason;
  }
  if (f.tcp) {
    j["proto"] = "tcp";
    j["src_port"] = f.tcp->src_port;
    j["dst_port"] = f.tcp->dst_port;
    j["seq"] = f.tcp->seq;
    j["tcp_flags"] = tcp_flags_string(f.tcp->flags);
    j["payload_len"] = f.tcp->payload_len;
  }
  if (f.mpa) {
    j["proto"] = "iwarp";
    j["mpa"] = f.mpa->request ? "MPA_REQUEST" : "MPA_REPLY";
  }
  if (f.fpdu) {
    const char* op = rdmap_opcode_name(f.fpdu->rdmap_opcode);
    j["proto"] = "iwarp";
    j["rdmap_opcode"] = op != nullptr ? op : hex(f.fpdu->rdmap_opcode, 1);
    j["fpdus"] = f.fpdu_count;
  }
  j["stop"] = stop_name(f.stop);
  if (f.stop != Stop::kComplete) j["why"] = f.why;
  return j;
}

}  // namespace rdmalab::faults
