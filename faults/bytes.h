// Big-endian field access on a byte span. Reads past the end return 0 and writes past the end
// do nothing: the parser checks every length before it reads, this is the second guard.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace rdmalab::faults {

using Bytes = std::span<const uint8_t>;
using MutBytes = std::span<uint8_t>;

inline bool fits(size_t size, size_t off, size_t n) {
  return off <= size && n <= size - off;
}
inline bool fits(Bytes b, size_t off, size_t n) {
  return fits(b.size(), off, n);
}

inline uint8_t get8(Bytes b, size_t off) {
  return off < b.size() ? b[off] : 0;
}
inline uint16_t get16(Bytes b, size_t off) {
  return static_cast<uint16_t>(get8(b, off) << 8 | get8(b, off + 1));
}
inline uint32_t get24(Bytes b, size_t off) {
  return uint32_t{get8(b, off)} << 16 | uint32_t{get8(b, off + 1)} << 8 | get8(b, off + 2);
}
inline uint32_t get32(Bytes b, size_t off) {
  return uint32_t{get16(b, off)} << 16 | get16(b, off + 2);
}
inline uint64_t get64(Bytes b, size_t off) {
  return uint64_t{get32(b, off)} << 32 | get32(b, off + 4);
}

inline void put8(MutBytes b, size_t off, uint8_t v) {
  if (off < b.size()) b[off] = v;
}
inline void put16(MutBytes b, size_t off, uint16_t v) {
  put8(b, off, static_cast<uint8_t>(v >> 8));
  put8(b, off + 1, static_cast<uint8_t>(v));
}
// Little-endian: the ICRC and the MPA CRC go on the wire least significant byte first.
inline void put32le(MutBytes b, size_t off, uint32_t v) {
  for (size_t i = 0; i < 4; ++i) put8(b, off + i, static_cast<uint8_t>(v >> (8 * i)));
}
inline uint32_t get32le(Bytes b, size_t off) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= uint32_t{get8(b, off + i)} << (8 * i);
  return v;
}

}  // namespace rdmalab::faults
