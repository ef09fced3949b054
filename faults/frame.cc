#include "faults/frame.h"

#include <cstdio>
#include <cstring>
#include <string_view>

namespace rdmalab::faults {
namespace {

constexpr uint16_t kEthertypeIpv4 = 0x0800, kEthertypeIpv6 = 0x86DD, kEthertypeArp = 0x0806,
                   kEthertypeVlan = 0x8100;
constexpr uint8_t kProtoTcp = 6, kProtoUdp = 17;
constexpr size_t kBthLen = 12, kIcrcLen = 4, kMadHeaderLen = 24;
constexpr std::string_view kMpaKeyReq = "MPA ID Req Frame", kMpaKeyRep = "MPA ID Rep Frame";

// Extension headers after the BTH, in the order IBTA vol. 1 ch. 9 puts them.
enum : uint16_t {
  kRdeth = 1 << 0,         // 4 bytes, RD
  kDeth = 1 << 1,          // 8 bytes, RD and UD
  kXrceth = 1 << 2,        // 4 bytes, XRC
  kReth = 1 << 3,          // 16 bytes
  kAtomicEth = 1 << 4,     // 28 bytes
  kAeth = 1 << 5,          // 4 bytes
  kAtomicAckEth = 1 << 6,  // 8 bytes
  kImmDt = 1 << 7,         // 4 bytes
  kIeth = 1 << 8,          // 4 bytes
  kNotLaidOut = 1 << 15,   // named, but its extension headers are not parsed here
};

struct Op {
  const char* name = nullptr;
  uint16_t headers = 0;
};

// IBTA 9.2 Table 38: the operation in bits 4-0 of the opcode, with its extension headers.
Op operation(uint8_t low5) {
  switch (low5) {
    case 0x00:
      return {"SEND_FIRST", 0};
    case 0x01:
      return {"SEND_MIDDLE", 0};
    case 0x02:
      return {"SEND_LAST", 0};
    case 0x03:
      return {"SEND_LAST_WITH_IMMEDIATE", kImmDt};
    case 0x04:
      return {"SEND_ONLY", 0};
    case 0x05:
      return {"SEND_ONLY_WITH_IMMEDIATE", kImmDt};
    case 0x06:
      return {"RDMA_WRITE_FIRST", kReth};
    case 0x07:
      return {"RDMA_WRITE_MIDDLE", 0};
    case 0x08:
      return {"RDMA_WRITE_LAST", 0};
    case 0x09:
      return {"RDMA_WRITE_LAST_WITH_IMMEDIATE", kImmDt};
    case 0x0A:
      return {"RDMA_WRITE_ONLY", kReth};
    case 0x0B:
      return {"RDMA_WRITE_ONLY_WITH_IMMEDIATE", kReth | kImmDt};
    case 0x0C:
      return {"RDMA_READ_REQUEST", kReth};
    case 0x0D:
      return {"RDMA_READ_RESPONSE_FIRST", kAeth};
    case 0x0E:
      return {"RDMA_READ_RESPONSE_MIDDLE", 0};
    case 0x0F:
      return {"RDMA_READ_RESPONSE_LAST", kAeth};
    case 0x10:
      return {"RDMA_READ_RESPONSE_ONLY", kAeth};
    case 0x11:
      return {"ACKNOWLEDGE", kAeth};
    case 0x12:
      return {"ATOMIC_ACKNOWLEDGE", kAeth | kAtomicAckEth};
    case 0x13:
      return {"COMPARE_SWAP", kAtomicEth};
    case 0x14:
      return {"FETCH_ADD", kAtomicEth};
    case 0x15:
      return {"RESYNC", 0};
    case 0x16:
      return {"SEND_LAST_WITH_INVALIDATE", kIeth};
    case 0x17:
      return {"SEND_ONLY_WITH_INVALIDATE", kIeth};
    case 0x1C:
      return {"FLUSH", kNotLaidOut};  // IBTA 1.5
    case 0x1D:
      return {"ATOMIC_WRITE", kNotLaidOut};  // IBTA 1.5
    default:
      return {};
  }
}

// Which operations each transport has (Table 38), plus its own headers.
Op opcode_info(uint8_t opcode) {
  const uint8_t low = opcode & 0x1F;
  Op op = operation(low);
  switch (opcode >> 5) {
    case 0:  // RC
      return low == 0x15 ? Op{} : op;
    case 1:  // UC: sends and writes only
      return low <= 0x0B ? op : Op{};
    case 2:  // RD
      if (low > 0x15) return {};
      op.headers |= kRdeth | kDeth;
      return op;
    case 3:  // UD
      if (low != 0x04 && low != 0x05) return {};
      op.headers |= kDeth;
      return op;
    case 4:  // CNP (RoCEv2 Annex A17): 0x81, 16 reserved bytes as payload
      return low == 0x01 ? Op{"CNP", 0} : Op{};
    case 5:  // XRC
      if (low == 0x15 || low > 0x17) return {};
      op.headers |= kXrceth;
      return op;
    default:
      return {};
  }
}

std::string hex(unsigned v, int width) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", width, v);
  return buf;
}

class Parser {
 public:
  Parser(Bytes b, Frame& f) : b_(b), f_(f) {}

  void run() {
    f_.len = b_.size();
    eth();
  }

 private:
  bool stop(Stop s, size_t off, std::string why) {
    f_.stop = s;
    f_.stop_offset = off;
    f_.why = std::move(why);
    return false;
  }
  bool truncated(size_t off, size_t have, size_t need, const char* what) {
    return stop(Stop::kTruncated, off,
                std::string(what) + ": " + std::to_string(have) + " of " + std::to_string(need) +
                    " bytes present");
  }
  size_t avail(size_t end, size_t off) const { return off < end ? end - off : 0; }

  bool eth() {
    if (!fits(b_, 0, 14)) return truncated(0, b_.size(), 14, "Ethernet header");
    Eth e;
    std::memcpy(e.dst.data(), b_.data(), 6);
    std::memcpy(e.src.data(), b_.data() + 6, 6);
    e.ethertype = get16(b_, 12);
    if (e.ethertype == kEthertypeVlan) {
      if (!fits(b_, 14, 4)) return truncated(14, b_.size() - 14, 4, "802.1Q tag");
      e.vlan_tci = get16(b_, 14);
      e.ethertype = get16(b_, 16);
      e.len = 18;
    }
    f_.eth = e;
    switch (e.ethertype) {
      case kEthertypeIpv4:
        return ipv4(e.len);
      case kEthertypeIpv6:
        return ipv6(e.len);
      case kEthertypeArp:
        return stop(Stop::kNotParsed, e.len, "ARP");
      default:
        return stop(Stop::kNotParsed, e.len, "ethertype " + hex(e.ethertype, 4));
    }
  }

  bool ipv4(size_t off) {
    if (!fits(b_, off, 20)) return truncated(off, avail(b_.size(), off), 20, "IPv4 header");
    Ip ip;
    ip.version = get8(b_, off) >> 4;
    ip.off = off;
    ip.header_len = size_t{get8(b_, off) & 0x0Fu} * 4;
    if (ip.version != 4) return stop(Stop::kBadHeader, off, "IPv4 version field is not 4");
    if (ip.header_len < 20) return stop(Stop::kBadHeader, off, "IPv4 IHL below 5");
    if (!fits(b_, off, ip.header_len))
      return truncated(off, avail(b_.size(), off), ip.header_len, "IPv4 header with options");
    ip.tos = get8(b_, off + 1);
    ip.length = get16(b_, off + 2);
    ip.id = get16(b_, off + 4);
    const uint16_t frag = get16(b_, off + 6);
    ip.df = frag & 0x4000;
    ip.mf = frag & 0x2000;
    ip.frag_offset = frag & 0x1FFF;
    ip.ttl = get8(b_, off + 8);
    ip.protocol = get8(b_, off + 9);
    ip.checksum = get16(b_, off + 10);
    std::memcpy(ip.src.data(), b_.data() + off + 12, 4);
    std::memcpy(ip.dst.data(), b_.data() + off + 16, 4);
    if (ip.length < ip.header_len)
      return stop(Stop::kBadHeader, off, "IPv4 total length below the header length");
    if (!fits(b_, off, ip.length))
      return truncated(off, avail(b_.size(), off), ip.length, "IPv4 datagram (total length)");
    ip.end = off + ip.length;  // bytes after it are Ethernet padding
    f_.ip = ip;
    if (ip.mf || ip.frag_offset != 0)
      return stop(Stop::kNotParsed, off + ip.header_len, "IPv4 fragment");
    return l4(off + ip.header_len);
  }

  bool ipv6(size_t off) {
    if (!fits(b_, off, 40)) return truncated(off, avail(b_.size(), off), 40, "IPv6 header");
    Ip ip;
    const uint32_t w0 = get32(b_, off);
    ip.version = static_cast<uint8_t>(w0 >> 28);
    if (ip.version != 6) return stop(Stop::kBadHeader, off, "IPv6 version field is not 6");
    ip.off = off;
    ip.header_len = 40;
    ip.tos = static_cast<uint8_t>(w0 >> 20);
    ip.flow_label = w0 & 0xFFFFF;
    ip.length = get16(b_, off + 4);
    ip.protocol = get8(b_, off + 6);
    ip.ttl = get8(b_, off + 7);
    std::memcpy(ip.src.data(), b_.data() + off + 8, 16);
    std::memcpy(ip.dst.data(), b_.data() + off + 24, 16);
    if (!fits(b_, off + 40, ip.length))
      return truncated(off, avail(b_.size(), off), 40 + size_t{ip.length},
                       "IPv6 datagram (payload length)");
    ip.end = off + 40 + ip.length;
    f_.ip = ip;
    return l4(off + 40);  // extension headers end up in l4's "not parsed"
  }

  bool l4(size_t off) {
    switch (f_.ip->protocol) {
      case kProtoUdp:
        return udp(off);
      case kProtoTcp:
        return tcp(off);
      default:
        return stop(Stop::kNotParsed, off,
                    "IP protocol / next header " + std::to_string(f_.ip->protocol));
    }
  }

  bool udp(size_t off) {
    const size_t end = f_.ip->end;
    if (!fits(end, off, 8)) return truncated(off, avail(end, off), 8, "UDP header");
    Udp u;
    u.off = off;
    u.src_port = get16(b_, off);
    u.dst_port = get16(b_, off + 2);
    u.length = get16(b_, off + 4);
    u.checksum = get16(b_, off + 6);
    if (u.length < 8) return stop(Stop::kBadHeader, off, "UDP length below 8");
    if (!fits(end, off, u.length))
      return stop(Stop::kBadHeader, off, "UDP length past the end of the IP datagram");
    f_.udp = u;
    if (u.dst_port != kRoceV2Port)
      return stop(Stop::kNotParsed, off + 8, "UDP port " + std::to_string(u.dst_port));
    return roce(off + 8, off + u.length);
  }

  // IBTA Annex A17: the UDP payload is BTH, extension headers, payload, pad, ICRC.
  bool roce(size_t off, size_t end) {
    if (!fits(end, off, kBthLen + kIcrcLen))
      return truncated(off, avail(end, off), kBthLen + kIcrcLen, "RoCEv2 BTH + ICRC");
    Bth h;
    h.off = off;
    h.opcode = get8(b_, off);
    const uint8_t b1 = get8(b_, off + 1);
    h.se = b1 & 0x80;
    h.mig_req = b1 & 0x40;
    h.pad_count = (b1 >> 4) & 0x03;
    h.tver = b1 & 0x0F;
    h.pkey = get16(b_, off + 2);
    h.fecn = get8(b_, off + 4) & 0x80;
    h.becn = get8(b_, off + 4) & 0x40;
    h.dest_qpn = get24(b_, off + 5);
    h.ack_req = get8(b_, off + 8) & 0x80;
    h.psn = get24(b_, off + 9);
    f_.bth = h;
    const size_t icrc_off = end - kIcrcLen;
    f_.icrc_off = icrc_off;
    f_.icrc = get32le(b_, icrc_off);
    const Op op = opcode_info(h.opcode);
    if (op.name == nullptr)
      return stop(Stop::kNotParsed, off, "BTH opcode " + hex(h.opcode, 2) + " has no layout");
    size_t pos = off + kBthLen;
    if (!extension_headers(op, pos, icrc_off)) return false;
    const size_t rest = icrc_off - pos;
    if (h.pad_count > rest) return stop(Stop::kBadHeader, off, "BTH pad count past the payload");
    f_.roce_payload_off = pos;
    f_.roce_payload_len = rest - h.pad_count;
    if (op.headers & kNotLaidOut)
      return stop(Stop::kNotParsed, pos, std::string(op.name) + " extension headers");
    const uint8_t low = h.opcode & 0x1F;
    if (f_.deth && h.dest_qpn == kGsiQpn && (low == 0x04 || low == 0x05))
      return mad(pos, pos + f_.roce_payload_len);
    return true;
  }

  bool extension_headers(const Op& op, size_t& pos, size_t end) {
    auto take = [&](uint16_t bit, size_t n, const char* what) {
      if (!(op.headers & bit)) return true;
      if (!fits(end, pos, n)) return truncated(pos, avail(end, pos), n, what);
      pos += n;
      return true;
    };
    if (!take(kRdeth, 4, "RDETH")) return false;
    if (op.headers & kDeth) {
      if (!fits(end, pos, 8)) return truncated(pos, avail(end, pos), 8, "DETH");
      f_.deth = Deth{pos, get32(b_, pos), get24(b_, pos + 5)};
    }
    if (!take(kDeth, 8, "DETH") || !take(kXrceth, 4, "XRCETH")) return false;
    if (op.headers & kReth) {
      if (!fits(end, pos, 16)) return truncated(pos, avail(end, pos), 16, "RETH");
      f_.reth = Reth{pos, get64(b_, pos), get32(b_, pos + 8), get32(b_, pos + 12)};
    }
    if (!take(kReth, 16, "RETH") || !take(kAtomicEth, 28, "AtomicETH")) return false;
    if (op.headers & kAeth) {
      if (!fits(end, pos, 4)) return truncated(pos, avail(end, pos), 4, "AETH");
      f_.aeth = Aeth{pos, get8(b_, pos), get24(b_, pos + 1)};
    }
    if (!take(kAeth, 4, "AETH") || !take(kAtomicAckEth, 8, "AtomicAckETH")) return false;
    if (op.headers & kImmDt) {
      if (!fits(end, pos, 4)) return truncated(pos, avail(end, pos), 4, "ImmDt");
      f_.immdt = get32(b_, pos);
    }
    if (!take(kImmDt, 4, "ImmDt")) return false;
    if (op.headers & kIeth) {
      if (!fits(end, pos, 4)) return truncated(pos, avail(end, pos), 4, "IETH");
      f_.ieth = get32(b_, pos);
    }
    return take(kIeth, 4, "IETH");
  }

  // The MAD common header (IBTA vol. 1 ch. 13.4); CM communication IDs per IBTA ch. 12.6.
  bool mad(size_t off, size_t end) {
    if (!fits(end, off, kMadHeaderLen))
      return truncated(off, avail(end, off), kMadHeaderLen, "MAD header");
    Mad m;
    m.off = off;
    m.len = end - off;
    m.base_version = get8(b_, off);
    m.mgmt_class = get8(b_, off + 1);
    m.class_version = get8(b_, off + 2);
    m.method = get8(b_, off + 3);
    m.status = get16(b_, off + 4);
    m.class_specific = get16(b_, off + 6);
    m.tid = get64(b_, off + 8);
    m.attr_id = get16(b_, off + 16);
    m.attr_mod = get32(b_, off + 20);
    if (m.mgmt_class == kMgmtClassCm) {
      // REQ (0x10) and SIDR (0x17, 0x18) have no remote ID at 28.
      const bool has_remote = m.attr_id != 0x10 && m.attr_id != 0x17 && m.attr_id != 0x18;
      const size_t need = kMadHeaderLen + (has_remote ? 8 : 4);
      if (!fits(end, off, need)) {
        f_.mad = m;
        return truncated(off, m.len, need, "CM message communication IDs");
      }
      m.local_comm_id = get32(b_, off + 24);
      if (has_remote) m.remote_comm_id = get32(b_, off + 28);
      cm_fields(m, off + kMadHeaderLen, end);
    }
    f_.mad = m;
    return true;
  }

  // The fields of a CM message (at off, after the MAD header) that tell connections apart:
  // IBTA vol. 1 12.6.5 REQ (Local QPN at byte 32), 12.6.8 REP (at 12), 12.6.7 REJ (Reason at
  // 10), 12.6.10 DREQ (Remote QPN at 8); each read only when the frame holds it.
  void cm_fields(Mad& m, size_t off, size_t end) {
    auto qpn = [&](size_t at) -> std::optional<uint32_t> {
      if (!fits(end, off + at, 4)) return std::nullopt;
      return (get32(b_, off + at) >> 8) & 0xFFFFFFu;
    };
    switch (m.attr_id) {
      case 0x10: m.local_qpn = qpn(32); break;
      case 0x13: m.local_qpn = qpn(12); break;
      case 0x15: m.remote_qpn = qpn(8); break;
      case 0x12:
        if (fits(end, off + 10, 2)) m.rej_reason = get16(b_, off + 10);
        break;
      default: break;
    }
  }

  bool tcp(size_t off) {
    const size_t end = f_.ip->end;
    if (!fits(end, off, 20)) return truncated(off, avail(end, off), 20, "TCP header");
    Tcp t;
    t.off = off;
    t.src_port = get16(b_, off);
    t.dst_port = get16(b_, off + 2);
    t.seq = get32(b_, off + 4);
    t.ack = get32(b_, off + 8);
    t.data_offset = get8(b_, off + 12) >> 4;
    t.flags = get8(b_, off + 13);
    t.window = get16(b_, off + 14);
    t.checksum = get16(b_, off + 16);
    t.urgent = get16(b_, off + 18);
    if (t.data_offset < 5) return stop(Stop::kBadHeader, off, "TCP data offset below 5");
    const size_t hlen = size_t{t.data_offset} * 4;
    if (!fits(end, off, hlen)) return truncated(off, avail(end, off), hlen, "TCP header options");
    t.payload_off = off + hlen;
    t.payload_len = end - t.payload_off;
    f_.tcp = t;
    if (t.payload_len == 0) return true;
    return iwarp(t.payload_off, end);
  }

  bool iwarp(size_t off, size_t end) {
    if (fits(end, off, 16)) {
      const std::string_view key(reinterpret_cast<const char*>(b_.data() + off), 16);
      if (key == kMpaKeyReq || key == kMpaKeyRep) return mpa_rr(off, end, key == kMpaKeyReq);
    }
    return fpdus(off, end);
  }

  bool mpa_rr(size_t off, size_t end, bool request) {
    if (!fits(end, off, 20)) return truncated(off, avail(end, off), 20, "MPA request/reply header");
    MpaRr m;
    m.off = off;
    m.request = request;
    m.flags = get8(b_, off + 16);
    m.revision = get8(b_, off + 17);
    m.pd_len = get16(b_, off + 18);
    m.pd_complete = fits(end, off + 20, m.pd_len);
    f_.mpa = m;
    return true;
  }

  // A segment is taken as FPDUs only when the framing checks: every FPDU in it has DDP and
  // RDMAP version 1 and a DDP header that fits its ULPDU, and they end exactly at the end of
  // the segment. A segment that starts mid-FPDU, or TCP that is not iWARP, is "unaligned".
  bool fpdus(size_t off, size_t end) {
    size_t pos = off;
    uint32_t count = 0;
    Fpdu first;
    while (pos < end) {
      std::optional<Fpdu> u = fpdu_at(pos, end);
      if (!u)
        return stop(Stop::kUnaligned, off,
                    "TCP payload does not start at an FPDU that checks (mid-FPDU, or not iWARP)");
      if (count++ == 0) first = *u;
      pos += u->len;
    }
    f_.fpdu = first;
    f_.fpdu_count = count;
    return true;
  }

  std::optional<Fpdu> fpdu_at(size_t pos, size_t end) const {
    if (!fits(end, pos, 4)) return std::nullopt;
    Fpdu u;
    u.off = pos;
    u.ulpdu_len = get16(b_, pos);
    const uint8_t ddp = get8(b_, pos + 2), rdmap = get8(b_, pos + 3);
    u.tagged = ddp & 0x80;
    u.last = ddp & 0x40;
    u.ddp_version = ddp & 0x03;
    u.rdmap_version = rdmap >> 6;
    u.rdmap_opcode = rdmap & 0x0F;
    u.header_len = u.tagged ? 14 : 18;
    const size_t unpadded = 2 + size_t{u.ulpdu_len};
    u.len = unpadded + (4 - unpadded % 4) % 4 + 4;
    if (u.ddp_version != 1 || u.rdmap_version != 1 || u.ulpdu_len < u.header_len ||
        !fits(end, pos, u.len))
      return std::nullopt;
    if (u.tagged) {
      u.stag = get32(b_, pos + 4);
      u.to = get64(b_, pos + 8);
    } else {
      u.stag = get32(b_, pos + 4);
      u.qn = get32(b_, pos + 8);
      u.msn = get32(b_, pos + 12);
      u.mo = get32(b_, pos + 16);
    }
    u.crc = get32le(b_, pos + u.len - 4);
    return u;
  }

  Bytes b_;
  Frame& f_;
};

}  // namespace

Frame parse(Bytes frame) {
  Frame f;
  Parser(frame, f).run();
  return f;
}

const char* bth_opcode_name(uint8_t opcode) {
  return opcode_info(opcode).name;
}

}  // namespace rdmalab::faults
