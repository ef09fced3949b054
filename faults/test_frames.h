// Frames built byte by byte for the tests and the fuzzer's seed corpus, with their checks
// computed here independently of the library: a bitwise CRC32 and CRC32c straight from the
// polynomials, a plain one's complement sum. Also the real frames of corpus/*.hex (captured in
// the VM lab from rxe and siw).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace rdmalab::faults::testing {

using Frame8 = std::vector<uint8_t>;
using Mac6 = std::array<uint8_t, 6>;

inline constexpr Mac6 kMacA = {0x52, 0x54, 0x00, 0x12, 0x34, 0x01};
inline constexpr Mac6 kMacB = {0x52, 0x54, 0x00, 0x12, 0x34, 0x02};
inline constexpr Mac6 kMacC = {0x52, 0x54, 0x00, 0x12, 0x34, 0x03};
inline constexpr Mac6 kBroadcast = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
inline constexpr std::array<uint8_t, 4> kIpA = {10, 0, 0, 1};
inline constexpr std::array<uint8_t, 4> kIpB = {10, 0, 0, 2};
inline constexpr std::array<uint8_t, 4> ip_of(const Mac6& m) {
  return {10, 0, 0, m[5]};
}

struct Buf {
  Frame8 b;
  Buf& u8(uint8_t v) {
    b.push_back(v);
    return *this;
  }
  Buf& u16(uint16_t v) { return u8(static_cast<uint8_t>(v >> 8)).u8(static_cast<uint8_t>(v)); }
  Buf& u24(uint32_t v) { return u8(static_cast<uint8_t>(v >> 16)).u16(static_cast<uint16_t>(v)); }
  Buf& u32(uint32_t v) { return u16(static_cast<uint16_t>(v >> 16)).u16(static_cast<uint16_t>(v)); }
  Buf& u64(uint64_t v) { return u32(static_cast<uint32_t>(v >> 32)).u32(static_cast<uint32_t>(v)); }
  template <class C>
  Buf& bytes(const C& c) {
    b.insert(b.end(), std::begin(c), std::end(c));
    return *this;
  }
  Buf& str(const std::string& s) { return bytes(s); }
  Buf& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

// CRC32 the long way: MSB-first register over the normal polynomial 0x04C11DB7, each input
// byte and the result bit-reflected, register preset to all 1s, result inverted.
inline uint32_t reflect(uint32_t v, int bits) {
  uint32_t r = 0;
  for (int i = 0; i < bits; ++i)
    if (v & (1u << i)) r |= 1u << (bits - 1 - i);
  return r;
}
inline uint32_t ref_crc(const Frame8& data, uint32_t poly) {
  uint32_t reg = 0xFFFFFFFFu;
  for (uint8_t byte : data) {
    reg ^= reflect(byte, 8) << 24;
    for (int k = 0; k < 8; ++k) reg = (reg & 0x80000000u) ? (reg << 1) ^ poly : reg << 1;
  }
  return ~reflect(reg, 32);
}
inline uint32_t ref_crc32(const Frame8& d) {
  return ref_crc(d, 0x04C11DB7u);
}
inline uint32_t ref_crc32c(const Frame8& d) {
  return ref_crc(d, 0x1EDC6F41u);
}

inline uint16_t ref_inet_sum(const Frame8& d) {
  uint64_t sum = 0;
  for (size_t i = 0; i < d.size(); i += 2)
    sum += (uint32_t{d[i]} << 8) | (i + 1 < d.size() ? d[i + 1] : 0);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

inline void put16_at(Frame8& f, size_t off, uint16_t v) {
  f[off] = static_cast<uint8_t>(v >> 8);
  f[off + 1] = static_cast<uint8_t>(v);
}

// RoCEv2 ICRC per IBTA Annex A17 for an untagged IPv4 (IHL 5) frame: 8 bytes of 1s, then the
// IP datagram up to the ICRC with TOS, TTL, IP checksum, UDP checksum and BTH byte 4 as 1s.
inline uint32_t ref_icrc_v4(const Frame8& frame) {
  Frame8 d(8, 0xFF);
  d.insert(d.end(), frame.begin() + 14, frame.end() - 4);
  d[8 + 1] = 0xFF;
  d[8 + 8] = 0xFF;
  d[8 + 10] = d[8 + 11] = 0xFF;
  d[8 + 26] = d[8 + 27] = 0xFF;
  d[8 + 28 + 4] = 0xFF;
  return ref_crc32(d);
}

inline Frame8 ipv4_frame(const Mac6& dst, const Mac6& src, uint8_t proto, const Frame8& l4,
                         std::array<uint8_t, 4> ip_src = kIpA,
                         std::array<uint8_t, 4> ip_dst = kIpB) {
  Buf ip;
  ip.u8(0x45).u8(0).u16(static_cast<uint16_t>(20 + l4.size())).u16(0x1234).u16(0x4000);
  ip.u8(64).u8(proto).u16(0).bytes(ip_src).bytes(ip_dst);
  put16_at(ip.b, 10, ref_inet_sum(ip.b));
  Buf f;
  f.bytes(dst).bytes(src).u16(0x0800).bytes(ip.b).bytes(l4);
  return f.b;
}

struct Roce {
  uint8_t opcode = 0x04;
  uint32_t dest_qpn = 0x12;
  uint32_t psn = 0;
  bool ack_req = true;
  uint8_t pad = 0;
  Frame8 ext;      // extension headers after the BTH
  Frame8 payload;  // pad bytes are added after it
  bool udp_checksum = false;
};

// Ethernet + IPv4 + UDP 4791 + BTH + ext + payload + pad + ICRC, A -> B.
inline Frame8 roce_v4(const Roce& r, const Mac6& dst = kMacB, const Mac6& src = kMacA) {
  Buf u;
  const size_t len = 8 + 12 + r.ext.size() + r.payload.size() + r.pad + 4;
  u.u16(49152).u16(4791).u16(static_cast<uint16_t>(len)).u16(0);
  u.u8(r.opcode).u8(static_cast<uint8_t>(r.pad << 4)).u16(0xFFFF);
  u.u8(0).u24(r.dest_qpn).u8(r.ack_req ? 0x80 : 0).u24(r.psn);
  u.bytes(r.ext).bytes(r.payload).zeros(r.pad).zeros(4);
  Frame8 f = ipv4_frame(dst, src, 17, u.b, ip_of(src), ip_of(dst));
  const uint32_t icrc = ref_icrc_v4(f);  // masks the UDP checksum: compute it first
  for (int i = 0; i < 4; ++i) f[f.size() - 4 + i] = static_cast<uint8_t>(icrc >> (8 * i));
  if (r.udp_checksum) {
    Buf ph;
    ph.bytes(ip_of(src)).bytes(ip_of(dst)).u8(0).u8(17).u16(static_cast<uint16_t>(len));
    Frame8 sum = ph.b;
    sum.insert(sum.end(), f.begin() + 34, f.end());
    uint16_t c = ref_inet_sum(sum);
    put16_at(f, 40, c == 0 ? 0xFFFF : c);
  }
  return f;
}

inline Frame8 deth(uint32_t qkey, uint32_t src_qpn) {
  return Buf{}.u32(qkey).u8(0).u24(src_qpn).b;
}

// RC SEND_ONLY to QPN 0x12 with 16 bytes of payload.
inline Frame8 send_only_to_0x12() {
  Roce r;
  r.psn = 0x123456;
  for (int i = 0; i < 16; ++i) r.payload.push_back(static_cast<uint8_t>(0xA0 + i));
  return roce_v4(r);
}

// A CM MAD (IBTA 12.6): UD SEND_ONLY to QP 1, DETH (Q_Key 0x80010000, src QP 1), a 256-byte MAD.
inline Frame8 cm_mad(uint16_t attr_id, uint32_t local_id, uint32_t remote_id, uint32_t psn = 7) {
  Roce r;
  r.opcode = 0x64;
  r.dest_qpn = 1;
  r.psn = psn;
  r.ext = deth(0x80010000u, 1);
  Buf m;
  m.u8(1).u8(0x07).u8(2).u8(0x03).u16(0).u16(0).u64(0x0000000211223344ull);
  m.u16(attr_id).u16(0).u32(0).u32(local_id).u32(remote_id);
  m.zeros(256 - m.b.size());
  r.payload = m.b;
  return roce_v4(r, kMacB, kMacA);
}
inline Frame8 cm_drep() {
  return cm_mad(0x16, 0x0A0B0C0D, 0x01020304);
}

// ACKNOWLEDGE with an AETH: syndrome byte, MSN.
inline Frame8 ack(uint8_t syndrome, uint32_t msn, uint32_t qpn = 0x12, uint32_t psn = 0x42) {
  Roce r;
  r.opcode = 0x11;
  r.dest_qpn = qpn;
  r.psn = psn;
  r.ack_req = false;
  r.ext = Buf{}.u8(syndrome).u24(msn).b;
  return roce_v4(r, kMacA, kMacB);
}
inline Frame8 rnr_nak() {
  return ack(0x20 | 0x0E, 5);
}  // RNR NAK, timer code 14

// UD SEND_ONLY to QPN 0x33 with a DETH and 8 bytes (pad 0).
inline Frame8 ud_send(bool udp_checksum = false) {
  Roce r;
  r.opcode = 0x64;
  r.dest_qpn = 0x33;
  r.psn = 9;
  r.ext = deth(0x11112222u, 0x44);
  r.payload = {1, 2, 3, 4, 5, 6, 7};
  r.pad = 1;
  r.udp_checksum = udp_checksum;
  return roce_v4(r);
}

inline Frame8 tcp_segment(uint16_t sport, uint16_t dport, uint32_t seq, uint32_t ack_no,
                          uint8_t flags, const Frame8& payload, const Frame8& options = {}) {
  Buf t;
  const uint8_t doff = static_cast<uint8_t>((20 + options.size()) / 4);
  t.u16(sport).u16(dport).u32(seq).u32(ack_no).u8(static_cast<uint8_t>(doff << 4)).u8(flags);
  t.u16(1004).u16(0).u16(0).bytes(options).bytes(payload);
  Buf ph;
  ph.bytes(kIpA).bytes(kIpB).u8(0).u8(6).u16(static_cast<uint16_t>(t.b.size()));
  Frame8 sum = ph.b;
  sum.insert(sum.end(), t.b.begin(), t.b.end());
  put16_at(t.b, 16, ref_inet_sum(sum));
  return ipv4_frame(kMacB, kMacA, 6, t.b);
}
inline Frame8 tcp_syn() {
  const Frame8 mss_and_nops = {0x02, 0x04, 0x05, 0xB4, 0x01, 0x01, 0x04, 0x02};  // MSS, SACK ok
  return tcp_segment(46658, 7471, 1000, 0, 0x02, {}, mss_and_nops);
}
inline Frame8 tcp_fin_ack() {
  return tcp_segment(46658, 7471, 2000, 3000, 0x11, {});
}

// MPA v2 request (RFC 5044 7.1, RFC 6581): key, flags 0x10 (enhanced), revision 2, IRD/ORD.
inline Frame8 mpa_request_payload() {
  return Buf{}.str("MPA ID Req Frame").u8(0x10).u8(2).u16(4).u16(1).u16(1).b;
}
inline Frame8 mpa_request() {
  return tcp_segment(46658, 7471, 1001, 5001, 0x18, mpa_request_payload());
}

// One untagged FPDU carrying an RDMAP Send (RFC 5041 4.2, RFC 5040 4.3): ULPDU length, DDP
// control (L=1, DV=1), RDMAP control (RV=1, opcode 3), Invalidate STag, QN 0, MSN, MO 0, data,
// pad to 4, CRC field (0: no CRC, siw's default; with_crc: CRC32c).
inline Frame8 fpdu_send(size_t data_len, uint32_t msn, bool with_crc = false) {
  Buf u;
  u.u16(static_cast<uint16_t>(18 + data_len)).u8(0x41).u8(0x43).u32(0).u32(0).u32(msn).u32(0);
  for (size_t i = 0; i < data_len; ++i) u.u8(static_cast<uint8_t>(i));
  while (u.b.size() % 4) u.u8(0);
  const uint32_t crc = with_crc ? ref_crc32c(u.b) : 0;
  for (int i = 0; i < 4; ++i) u.u8(static_cast<uint8_t>(crc >> (8 * i)));
  return u.b;
}
inline Frame8 fpdu_segment(const Frame8& fpdus) {
  return tcp_segment(46658, 7471, 1025, 5025, 0x18, fpdus);
}
inline Frame8 fpdu_send_frame(bool with_crc = false) {
  return fpdu_segment(fpdu_send(64, 1, with_crc));
}

inline Frame8 arp_request(const Mac6& src = kMacA) {
  Buf a;
  a.bytes(kBroadcast).bytes(src).u16(0x0806).u16(1).u16(0x0800).u8(6).u8(4).u16(1);
  a.bytes(src).bytes(kIpA).zeros(6).bytes(kIpB);
  return a.b;
}
inline Frame8 unicast(const Mac6& dst, const Mac6& src, uint8_t tag) {
  Buf a;
  a.bytes(dst).bytes(src).u16(0x88B5).u8(tag).zeros(45);  // local experimental ethertype
  return a.b;
}

// A frame of corpus/NAME.hex: '#' lines are comments, the rest hex digits.
inline Frame8 load_hex(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line, hex;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') hex += line;
  Frame8 out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr, 16)));
  return out;
}

}  // namespace rdmalab::faults::testing
