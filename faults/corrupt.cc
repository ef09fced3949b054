#include "faults/corrupt.h"

#include <array>
#include <utility>

#include "faults/checksum.h"

namespace rdmalab::faults {
namespace {

constexpr std::array<std::pair<Layer, const char*>, 16> kLayers = {{
    {Layer::kEth, "eth"},
    {Layer::kIp, "ip"},
    {Layer::kUdp, "udp"},
    {Layer::kTcp, "tcp"},
    {Layer::kIcrc, "icrc"},
    {Layer::kBth, "bth"},
    {Layer::kDeth, "deth"},
    {Layer::kReth, "reth"},
    {Layer::kAeth, "aeth"},
    {Layer::kMad, "mad"},
    {Layer::kPayload, "payload"},
    {Layer::kTcpPayload, "tcp_payload"},
    {Layer::kMpa, "mpa"},
    {Layer::kDdp, "ddp"},
    {Layer::kRdmap, "rdmap"},
    {Layer::kUlpPayload, "ulp_payload"},
}};

// Where the receiver gets to each layer: rxe checks the ICRC (rank 3) before the BTH (4); MPA
// checks its CRC (3) before DDP (4); IP (1) and UDP/TCP (2) check theirs first.
int rank(Layer l) {
  switch (l) {
    case Layer::kEth:
      return 0;
    case Layer::kIp:
      return 1;
    case Layer::kUdp:
    case Layer::kTcp:
      return 2;
    case Layer::kIcrc:
    case Layer::kTcpPayload:
    case Layer::kMpa:
      return 3;
    case Layer::kBth:
    case Layer::kDdp:
      return 4;
    case Layer::kDeth:
    case Layer::kReth:
    case Layer::kAeth:
    case Layer::kRdmap:
      return 5;
    case Layer::kMad:
    case Layer::kPayload:
    case Layer::kUlpPayload:
      return 6;
  }
  return 0;
}
constexpr int kRankIpv4 = 1, kRankL4 = 2, kRankIcrc = 3, kRankMpaCrc = 3;

}  // namespace

const char* layer_name(Layer l) {
  for (const auto& [layer, name] : kLayers)
    if (layer == l) return name;
  return "?";
}

std::optional<Layer> layer_from_name(std::string_view name) {
  for (const auto& [layer, n] : kLayers)
    if (name == n) return layer;
  return std::nullopt;
}

std::string layer_names() {
  std::string s;
  for (const auto& [layer, name] : kLayers) s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}

std::optional<Span> layer_span(const Frame& f, Layer l) {
  switch (l) {
    case Layer::kEth:
      if (f.eth) return Span{0, f.eth->len};
      break;
    case Layer::kIp:
      if (f.ip) return Span{f.ip->off, f.ip->header_len};
      break;
    case Layer::kUdp:
      if (f.udp) return Span{f.udp->off, 8};
      break;
    case Layer::kTcp:
      if (f.tcp) return Span{f.tcp->off, size_t{f.tcp->data_offset} * 4};
      break;
    case Layer::kIcrc:
      if (f.icrc_off) return Span{*f.icrc_off, 4};
      break;
    case Layer::kBth:
      if (f.bth) return Span{f.bth->off, 12};
      break;
    case Layer::kDeth:
      if (f.deth) return Span{f.deth->off, 8};
      break;
    case Layer::kReth:
      if (f.reth) return Span{f.reth->off, 16};
      break;
    case Layer::kAeth:
      if (f.aeth) return Span{f.aeth->off, 4};
      break;
    case Layer::kMad:
      if (f.mad) return Span{f.mad->off, f.mad->len};
      break;
    case Layer::kPayload:
      if (f.bth && f.icrc_off) return Span{f.roce_payload_off, f.roce_payload_len};
      break;
    case Layer::kTcpPayload:
      if (f.tcp) return Span{f.tcp->payload_off, f.tcp->payload_len};
      break;
    case Layer::kMpa:
      if (f.mpa && f.tcp)
        return Span{f.mpa->off, f.tcp->payload_off + f.tcp->payload_len - f.mpa->off};
      if (f.fpdu) return Span{f.fpdu->off, f.fpdu->len};
      break;
    case Layer::kDdp:
      if (f.fpdu) return Span{f.fpdu->off + 2, f.fpdu->header_len};
      break;
    case Layer::kRdmap:
      if (f.fpdu) return Span{f.fpdu->off + 3, f.fpdu->header_len - 1};
      break;
    case Layer::kUlpPayload:
      if (f.fpdu)
        return Span{f.fpdu->off + 2 + f.fpdu->header_len,
                    size_t{f.fpdu->ulpdu_len} - f.fpdu->header_len};
      break;
  }
  return std::nullopt;
}

CorruptResult corrupt(std::vector<uint8_t>& bytes, const Frame& f, const CorruptSpec& spec) {
  CorruptResult r;
  const auto span = layer_span(f, spec.layer);
  if (!span || spec.offset >= span->len || span->off + spec.offset >= bytes.size()) return r;
  const size_t at = span->off + spec.offset;
  bytes[at] ^= spec.xor_mask;
  r.applied = true;
  r.frame_offset = at;
  const int layer_rank = rank(spec.layer);
  const auto hit = [at](size_t off, size_t n) { return at >= off && at < off + n; };
  const Bytes view(bytes);
  // Innermost first: the outer checksums cover the inner ones.
  if (f.fpdu && f.fpdu->crc != 0 && layer_rank >= kRankMpaCrc) {
    const size_t crc_at = f.fpdu->off + f.fpdu->len - 4;
    if (!hit(crc_at, 4)) {
      put32le(bytes, crc_at, *mpa_crc(view, f));
      r.recomputed.emplace_back("mpa_crc");
    }
  }
  if (f.icrc_off && layer_rank >= kRankIcrc && !hit(*f.icrc_off, 4)) {
    if (const auto c = icrc_compute(view, f)) {
      put32le(bytes, *f.icrc_off, *c);
      r.recomputed.emplace_back("icrc");
    }
  }
  if (f.udp && f.udp->checksum != 0 && layer_rank >= kRankL4 && !hit(f.udp->off + 6, 2)) {
    put16(bytes, f.udp->off + 6, *udp_checksum(view, f));
    r.recomputed.emplace_back("udp");
  }
  if (f.tcp && layer_rank >= kRankL4 && !hit(f.tcp->off + 16, 2)) {
    put16(bytes, f.tcp->off + 16, *tcp_checksum(view, f));
    r.recomputed.emplace_back("tcp");
  }
  if (f.ip && f.ip->version == 4 && layer_rank >= kRankIpv4 && !hit(f.ip->off + 10, 2)) {
    put16(bytes, f.ip->off + 10, *ipv4_header_checksum(view, f));
    r.recomputed.emplace_back("ipv4");
  }
  return r;
}

}  // namespace rdmalab::faults
