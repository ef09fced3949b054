// Corruption: flip bits of one byte at an offset inside a named layer, then recompute every
// check the receiver makes before it processes that layer, so that the corruption reaches it
// (a flipped BTH bit gets a fresh ICRC, UDP and IPv4 checksum; a flipped ICRC byte keeps its
// bad ICRC but gets a UDP checksum that matches). A check whose own field was hit stays as
// corrupted. A UDP checksum of 0 (rxe sends 0) stays 0; the MPA CRC is recomputed only where
// the FPDU carries one (siw negotiates none by default: the field is 0).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "faults/frame.h"

namespace rdmalab::faults {

enum class Layer : uint8_t {
  kEth,
  kIp,
  kUdp,
  kTcp,
  kIcrc,
  kBth,
  kDeth,
  kReth,
  kAeth,
  kMad,
  kPayload,     // RoCE payload after the extension headers, pad excluded
  kTcpPayload,  // everything after the TCP header
  kMpa,         // the MPA request/reply, or the first FPDU from its length field to its CRC
  kDdp,         // the first FPDU's DDP header
  kRdmap,       // from the RDMAP control byte (the DDP header's first byte reserved for ULP)
  kUlpPayload,  // the first FPDU's payload after the DDP header
};
const char* layer_name(Layer l);
std::optional<Layer> layer_from_name(std::string_view name);
std::string layer_names();  // "eth, ip, ..." for error messages

struct Span {
  size_t off = 0;
  size_t len = 0;
};
// Where the layer is in this frame; nullopt where the frame does not have it.
std::optional<Span> layer_span(const Frame& f, Layer l);

struct CorruptSpec {
  Layer layer = Layer::kBth;
  size_t offset = 0;  // relative to the layer's first byte
  uint8_t xor_mask = 0xFF;
};

struct CorruptResult {
  bool applied = false;                 // false: no such layer, or the offset is past its end
  size_t frame_offset = 0;              // the byte flipped
  std::vector<std::string> recomputed;  // "mpa_crc", "icrc", "udp", "tcp", "ipv4"
};

// f is bytes parsed before the change; lengths and positions are taken from it.
CorruptResult corrupt(std::vector<uint8_t>& bytes, const Frame& f, const CorruptSpec& spec);

}  // namespace rdmalab::faults
