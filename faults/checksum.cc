#include "faults/checksum.h"

#include <array>
#include <cstring>

namespace rdmalab::faults {
namespace {

constexpr std::array<uint32_t, 256> crc_table(uint32_t reflected_poly) {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ reflected_poly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kCrc32Table = crc_table(0xEDB88320u);   // 0x04C11DB7 reflected
constexpr auto kCrc32cTable = crc_table(0x82F63B78u);  // 0x1EDC6F41 reflected

uint32_t crc_run(const std::array<uint32_t, 256>& t, uint32_t crc, Bytes data) {
  for (uint8_t b : data) crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return crc;
}

// One's complement sum of 16-bit big-endian words over [start, end), skipping the 2-byte
// field at skip (the checksum being computed); an odd last byte is padded with 0.
uint32_t sum_words(Bytes b, size_t start, size_t end, size_t skip, uint32_t sum = 0) {
  for (size_t i = start; i < end; i += 2) {
    if (i == skip) continue;
    sum += i + 1 < end ? get16(b, i) : uint32_t{get8(b, i)} << 8;
  }
  return sum;
}

uint16_t fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum & 0xFFFF);
}

// RFC 768 / RFC 793 pseudo header (IPv4) or RFC 8200 8.1 (IPv6).
uint32_t pseudo_sum(const Ip& ip, size_t l4_len) {
  uint32_t sum = 0;
  const size_t n = ip.version == 6 ? 16 : 4;
  for (size_t i = 0; i < n; i += 2) {
    sum += uint32_t{ip.src[i]} << 8 | ip.src[i + 1];
    sum += uint32_t{ip.dst[i]} << 8 | ip.dst[i + 1];
  }
  sum += ip.protocol;
  sum += static_cast<uint32_t>(l4_len >> 16) + static_cast<uint32_t>(l4_len & 0xFFFF);
  return sum;
}

}  // namespace

uint32_t crc32_ieee(uint32_t crc, Bytes data) {
  return crc_run(kCrc32Table, crc, data);
}
uint32_t crc32c(uint32_t crc, Bytes data) {
  return crc_run(kCrc32cTable, crc, data);
}

std::optional<uint32_t> icrc_compute(Bytes frame, const Frame& f) {
  if (!f.ip || !f.udp || !f.bth || !f.icrc_off) return std::nullopt;
  const Ip& ip = *f.ip;
  // The masked copy: IP header, UDP header, BTH (at most 60 + 8 + 12 bytes).
  std::array<uint8_t, 80> ps{};
  const size_t udp_at = ip.header_len, bth_at = udp_at + 8, n = bth_at + 12;
  if (n > ps.size() || f.udp->off != ip.off + ip.header_len || f.bth->off != f.udp->off + 8)
    return std::nullopt;
  std::memcpy(ps.data(), frame.data() + ip.off, n);
  if (ip.version == 4) {
    ps[1] = 0xFF;            // TOS
    ps[8] = 0xFF;            // TTL
    ps[10] = ps[11] = 0xFF;  // header checksum
  } else {
    ps[0] |= 0x0F;                 // traffic class, high nibble
    ps[1] = ps[2] = ps[3] = 0xFF;  // traffic class low nibble, flow label
    ps[7] = 0xFF;                  // hop limit
  }
  ps[udp_at + 6] = ps[udp_at + 7] = 0xFF;  // UDP checksum
  ps[bth_at + 4] = 0xFF;                   // FECN, BECN, reserved
  static constexpr std::array<uint8_t, 8> kMaskedLrh = {0xFF, 0xFF, 0xFF, 0xFF,
                                                        0xFF, 0xFF, 0xFF, 0xFF};
  uint32_t crc = crc32_ieee(0xFFFFFFFFu, kMaskedLrh);
  crc = crc32_ieee(crc, Bytes(ps.data(), n));
  const size_t rest = f.bth->off + 12;
  crc = crc32_ieee(crc, frame.subspan(rest, *f.icrc_off - rest));
  return ~crc;
}

bool icrc_ok(Bytes frame, const Frame& f) {
  const auto c = icrc_compute(frame, f);
  return c && *c == f.icrc;
}

std::optional<uint16_t> ipv4_header_checksum(Bytes frame, const Frame& f) {
  if (!f.ip || f.ip->version != 4) return std::nullopt;
  return fold(sum_words(frame, f.ip->off, f.ip->off + f.ip->header_len, f.ip->off + 10));
}

std::optional<uint16_t> udp_checksum(Bytes frame, const Frame& f) {
  if (!f.ip || !f.udp) return std::nullopt;
  const size_t end = f.udp->off + f.udp->length;
  const uint16_t c =
      fold(sum_words(frame, f.udp->off, end, f.udp->off + 6, pseudo_sum(*f.ip, f.udp->length)));
  return c == 0 ? uint16_t{0xFFFF} : c;  // 0 means "no checksum": RFC 768 sends all 1s
}

std::optional<uint16_t> tcp_checksum(Bytes frame, const Frame& f) {
  if (!f.ip || !f.tcp) return std::nullopt;
  const size_t len = f.ip->end - f.tcp->off;
  return fold(sum_words(frame, f.tcp->off, f.ip->end, f.tcp->off + 16, pseudo_sum(*f.ip, len)));
}

std::optional<uint32_t> mpa_crc(Bytes frame, const Frame& f) {
  if (!f.fpdu) return std::nullopt;
  return ~crc32c(0xFFFFFFFFu, frame.subspan(f.fpdu->off, f.fpdu->len - 4));
}

bool ipv4_checksum_ok(Bytes frame, const Frame& f) {
  const auto c = ipv4_header_checksum(frame, f);
  return c && *c == f.ip->checksum;
}

bool udp_checksum_ok(Bytes frame, const Frame& f) {
  if (!f.udp) return false;
  if (f.udp->checksum == 0) return true;  // rxe sends 0 over IPv4 and IPv6 alike
  const auto c = udp_checksum(frame, f);
  return c && *c == f.udp->checksum;
}

bool tcp_checksum_ok(Bytes frame, const Frame& f) {
  const auto c = tcp_checksum(frame, f);
  return c && *c == f.tcp->checksum;
}

}  // namespace rdmalab::faults
