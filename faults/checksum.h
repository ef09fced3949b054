// The checks a receiver makes before it reads a header: the IPv4 header checksum, the UDP and
// TCP checksums (RFC 768/793, RFC 2460 pseudo header for IPv6), the RoCEv2 ICRC (IBTA Annex
// A17) and the MPA CRC (RFC 5044, CRC32c). Each computes over a parsed frame; nullopt where the
// frame does not carry that check.
#pragma once

#include <cstdint>
#include <optional>

#include "faults/bytes.h"
#include "faults/frame.h"

namespace rdmalab::faults {

// Reflected CRC32 (polynomial 0x04C11DB7, IEEE 802.3), raw register: no inversions, so it
// chains like the kernel's crc32_le.
uint32_t crc32_ieee(uint32_t crc, Bytes data);
// Reflected CRC32c (polynomial 0x1EDC6F41, Castagnoli), raw register.
uint32_t crc32c(uint32_t crc, Bytes data);

// RoCEv2 ICRC: CRC32 over 8 bytes of 0xFF (the masked LRH), the IP header with the fields a
// router may change set to 1s (IPv4 TOS, TTL, header checksum; IPv6 traffic class, flow label,
// hop limit), the UDP header with its checksum set to 1s, the BTH with byte 4 (FECN, BECN,
// reserved) set to 1s, then everything up to the ICRC. The wire carries the inverted register,
// least significant byte first (rxe_icrc.c). Checked by rxe before the BTH is processed.
std::optional<uint32_t> icrc_compute(Bytes frame, const Frame& f);
bool icrc_ok(Bytes frame, const Frame& f);

// Checksum field values that make the checks pass.
std::optional<uint16_t> ipv4_header_checksum(Bytes frame, const Frame& f);
std::optional<uint16_t> udp_checksum(Bytes frame, const Frame& f);  // never 0 (RFC 768)
std::optional<uint16_t> tcp_checksum(Bytes frame, const Frame& f);
// CRC32c over the first FPDU from its length field through the pad, inverted, least
// significant byte first as siw writes it. siw negotiates no MPA CRC by default (field 0).
std::optional<uint32_t> mpa_crc(Bytes frame, const Frame& f);

bool ipv4_checksum_ok(Bytes frame, const Frame& f);
bool udp_checksum_ok(Bytes frame, const Frame& f);  // true for 0: no checksum (rxe sends 0)
bool tcp_checksum_ok(Bytes frame, const Frame& f);

}  // namespace rdmalab::faults
