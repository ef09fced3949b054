// What the switch sees in one Ethernet frame (no FCS): Ethernet II with at most one 802.1Q
// tag, IPv4 or IPv6, UDP or TCP; RoCEv2 (UDP destination port 4791: BTH, its extension headers,
// a MAD on QP 1, the ICRC) and iWARP (TCP: MPA request/reply, MPA FPDUs with DDP and RDMAP
// headers). parse() never reads out of bounds and never throws: it fills what it could and says
// where and why it stopped. Layouts cite IBTA vol. 1 (ch. 9 and 13, Annex A17), RFC 5044 (MPA),
// RFC 5041 (DDP) and RFC 5040 (RDMAP).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "faults/bytes.h"
#include "rdmalab/types.h"  // cm_attr_name, cm_attr_id: one CM attribute table with the model

namespace rdmalab::faults {

enum class Stop : uint8_t {
  kComplete,   // every layer the parser knows was parsed
  kTruncated,  // a header or a length field runs past the data present
  kBadHeader,  // a field is out of range (IHL < 5, UDP length < 8, pad past the payload...)
  kNotParsed,  // a layer the parser does not look into (ARP, IPv4 fragments, other ports...)
  kUnaligned,  // a TCP payload that does not start at an FPDU boundary that can be checked
};
const char* stop_name(Stop s);

using Mac = std::array<uint8_t, 6>;

struct Eth {
  Mac dst{};
  Mac src{};
  uint16_t ethertype = 0;  // after the 802.1Q tag when there is one
  std::optional<uint16_t> vlan_tci;
  size_t len = 14;  // 18 with a tag
};

struct Ip {
  uint8_t version = 0;  // 4 or 6
  size_t off = 0;
  size_t header_len = 0;  // IHL * 4, or 40
  size_t end = 0;         // end of the datagram in the frame (Ethernet padding excluded)
  uint8_t protocol = 0;   // IPv4 protocol, IPv6 next header
  uint8_t tos = 0;        // IPv4 TOS, IPv6 traffic class
  uint8_t ttl = 0;        // IPv4 TTL, IPv6 hop limit
  uint16_t length = 0;    // IPv4 total length, IPv6 payload length
  uint16_t id = 0;        // IPv4 only from here
  bool df = false;
  bool mf = false;
  uint16_t frag_offset = 0;  // in 8-byte units
  uint16_t checksum = 0;
  uint32_t flow_label = 0;        // IPv6 only
  std::array<uint8_t, 16> src{};  // IPv4: first 4 bytes
  std::array<uint8_t, 16> dst{};
};

struct Udp {
  size_t off = 0;
  uint16_t src_port = 0, dst_port = 0, length = 0, checksum = 0;
};

namespace tcp_flag {
inline constexpr uint8_t FIN = 0x01, SYN = 0x02, RST = 0x04, PSH = 0x08, ACK = 0x10, URG = 0x20,
                         ECE = 0x40, CWR = 0x80;
}

struct Tcp {
  size_t off = 0;
  uint16_t src_port = 0, dst_port = 0;
  uint32_t seq = 0, ack = 0;
  uint8_t data_offset = 0;  // in 32-bit words
  uint8_t flags = 0;        // tcp_flag bits
  uint16_t window = 0, checksum = 0, urgent = 0;
  size_t payload_off = 0, payload_len = 0;
};

// IBTA 9.2 Base Transport Header, 12 bytes.
struct Bth {
  size_t off = 0;
  uint8_t opcode = 0;  // bits 7-5 transport (RC, UC, RD, UD, CNP, XRC), 4-0 operation
  bool se = false;
  bool mig_req = false;
  uint8_t pad_count = 0;
  uint8_t tver = 0;
  uint16_t pkey = 0;
  bool fecn = false;  // byte 4: RoCEv2 keeps FECN/BECN there; the ICRC masks the whole byte
  bool becn = false;
  uint32_t dest_qpn = 0;
  bool ack_req = false;
  uint32_t psn = 0;
};

struct Deth {  // IBTA vol. 1 ch. 9.3, 8 bytes
  size_t off = 0;
  uint32_t qkey = 0;
  uint32_t src_qpn = 0;
};
struct Reth {  // 16 bytes
  size_t off = 0;
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t dma_length = 0;
};
struct Aeth {  // 4 bytes: syndrome (type in bits 6-5, value in 4-0) and MSN
  size_t off = 0;
  uint8_t syndrome = 0;
  uint32_t msn = 0;
};

// IBTA vol. 1 ch. 13.4 common MAD header (24 bytes); for the CM class (0x07) the communication IDs
// of IBTA 12.6 (Tables 106-120): local at MAD offset 24, remote at 28; SIDR messages carry a
// request ID at 24 instead, REQ and SIDR have no remote ID.
struct Mad {
  size_t off = 0;
  size_t len = 0;  // bytes present (256 for a whole MAD)
  uint8_t base_version = 0, mgmt_class = 0, class_version = 0, method = 0;
  uint16_t status = 0, class_specific = 0;
  uint64_t tid = 0;
  uint16_t attr_id = 0;
  uint32_t attr_mod = 0;
  std::optional<uint32_t> local_comm_id;
  std::optional<uint32_t> remote_comm_id;
  // The QPN the message names (IBTA ch. 12.6): REQ's and REP's Local QPN (the sender's),
  // DREQ's Remote QPN (the receiver's). Stale connections (12.4.1) are told by QPN.
  std::optional<uint32_t> local_qpn, remote_qpn;
  std::optional<uint16_t> rej_reason;  // REJ's Reason (table 112: 8 invalid service ID, 10 stale)
};

// RFC 5044 7.1 (MPA v2 is RFC 6581): 16-byte key, flags (M, C, R, enhanced), revision,
// private data length, private data.
struct MpaRr {
  size_t off = 0;
  bool request = false;
  uint8_t flags = 0;  // high byte of the 16-bit field: 0x80 markers, 0x40 CRC, 0x20 reject, 0x10 v2
  uint8_t revision = 0;
  uint16_t pd_len = 0;
  bool pd_complete = false;  // private data all in this segment
};

// One MPA FPDU (RFC 5044 4): ULPDU length, the ULPDU (DDP header, RDMAP control in the DDP
// header's first reserved-for-ULP byte, payload), pad to 4 bytes, CRC field. The CRC field is
// always present and 0 when CRC was not negotiated (siw's default).
struct Fpdu {
  size_t off = 0;
  size_t len = 0;  // 2 + ULPDU length + pad + 4
  uint16_t ulpdu_len = 0;
  bool tagged = false;
  bool last = false;
  uint8_t ddp_version = 0;
  uint8_t rdmap_version = 0;
  uint8_t rdmap_opcode = 0;
  uint32_t stag = 0;  // tagged: STag; untagged: Invalidate STag (RDMAP's use of RsvdULP)
  uint64_t to = 0;    // tagged only
  uint32_t qn = 0, msn = 0, mo = 0;  // untagged only
  size_t header_len = 0;             // DDP header incl. RDMAP control: 14 tagged, 18 untagged
  uint32_t crc = 0;
};

struct Frame {
  size_t len = 0;
  std::optional<Eth> eth;
  std::optional<Ip> ip;
  std::optional<Udp> udp;
  std::optional<Tcp> tcp;
  // RoCEv2
  std::optional<Bth> bth;
  std::optional<Deth> deth;
  std::optional<Reth> reth;
  std::optional<Aeth> aeth;
  std::optional<uint32_t> immdt;
  std::optional<uint32_t> ieth;  // the R_Key to invalidate
  std::optional<Mad> mad;
  size_t roce_payload_off = 0, roce_payload_len = 0;
  std::optional<size_t> icrc_off;
  uint32_t icrc = 0;  // as on the wire, read little-endian
  // iWARP
  std::optional<MpaRr> mpa;
  std::optional<Fpdu> fpdu;  // the first FPDU of the segment
  uint32_t fpdu_count = 0;
  // Where parsing stopped and why.
  Stop stop = Stop::kComplete;
  size_t stop_offset = 0;
  std::string why;
};

Frame parse(Bytes frame);

// Names as the specifications spell them; nullptr where the value has no name. CM attribute
// IDs: rdmalab::cm_attr_name (rdmalab/types.h).
const char* bth_opcode_name(uint8_t opcode);     // "SEND_ONLY", ... (the operation, any transport)
const char* bth_transport_name(uint8_t opcode);  // "RC", "UC", "RD", "UD", "CNP", "XRC"
const char* aeth_syndrome_name(uint8_t syndrome);  // "ACK", "RNR_NAK", "NAK_SEQ", ...
const char* rdmap_opcode_name(uint8_t opcode);     // "RDMA_WRITE", ... "TERMINATE"
std::string tcp_flags_string(uint8_t flags);       // "FIN|ACK"
std::string mac_string(const Mac& m);
std::string ip_string(const Ip& ip, bool src);

inline constexpr uint16_t kRoceV2Port = 4791;
inline constexpr uint8_t kMgmtClassCm = 0x07;
inline constexpr uint32_t kGsiQpn = 1;

// One line of JSON for the history: addresses, the protocol fields, where parsing stopped.
nlohmann::json summary(const Frame& f);

}  // namespace rdmalab::faults
