// The switch's frame parser over a pcap file (rdmalab-switch --decode-pcap): the evidence of a
// scenario decodes its capture with the same parser the rules match with.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ostream>
#include <stdexcept>

#include "faults/frame.h"
#include "faults/pcap.h"

namespace rdmalab::faults {
namespace {

constexpr uint32_t kMicros = 0xA1B2C3D4, kNanos = 0xA1B23C4D, kLinkTypeEthernet = 1;
constexpr uint32_t kMaxRecord = 256 * 1024;  // larger than any snaplen the lab uses

uint32_t bswap(uint32_t v) {
  return (v >> 24) | ((v >> 8) & 0xFF00) | ((v << 8) & 0xFF0000) | (v << 24);
}

// Reads n bytes; false at a clean end of file before any byte, throws on a read error.
// `got` says how many came (fewer than n: the file ends inside).
bool read_full(int fd, uint8_t* p, size_t n, size_t& got, const std::string& path) {
  got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw std::runtime_error("pcap " + path + ": " + std::strerror(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got == n;
}

}  // namespace

uint32_t PcapReader::u32(const uint8_t* p) const {
  const uint32_t v = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                     static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  return swap_ ? bswap(v) : v;
}

PcapReader::PcapReader(const std::string& path)
    : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
  if (!fd_) throw std::runtime_error("pcap " + path + ": " + std::strerror(errno));
  uint8_t h[24];
  size_t got = 0;
  if (!read_full(fd_.get(), h, sizeof h, got, path))
    throw std::runtime_error("pcap " + path + ": " + std::to_string(got) +
                             " bytes, shorter than the 24-byte pcap header");
  const uint32_t magic = u32(h);
  if (magic == kMicros || magic == kNanos) {
    nanos_ = magic == kNanos;
  } else if (bswap(magic) == kMicros || bswap(magic) == kNanos) {
    swap_ = true;
    nanos_ = bswap(magic) == kNanos;
  } else {
    throw std::runtime_error("pcap " + path + ": not a classic pcap file (magic " +
                             std::to_string(magic) + "; pcapng is not read)");
  }
  if (const uint32_t link = u32(h + 20) & 0x0FFFFFFF; link != kLinkTypeEthernet)
    throw std::runtime_error("pcap " + path + ": link type " + std::to_string(link) +
                             ", not Ethernet (1)");
}

std::optional<PcapReader::Record> PcapReader::next() {
  uint8_t h[16];
  size_t got = 0;
  if (!read_full(fd_.get(), h, sizeof h, got, path_)) {
    torn_ = got != 0;
    return std::nullopt;
  }
  Record r;
  const uint64_t frac = u32(h + 4);
  r.t_ns = static_cast<uint64_t>(u32(h)) * 1'000'000'000ull + (nanos_ ? frac : frac * 1000);
  const uint32_t incl = u32(h + 8);
  r.orig_len = u32(h + 12);
  if (incl > kMaxRecord) {
    torn_ = true;  // garbage, or a writer cut off mid-header: stop here
    return std::nullopt;
  }
  r.data.resize(incl);
  if (!read_full(fd_.get(), r.data.data(), incl, got, path_)) {
    torn_ = true;
    return std::nullopt;
  }
  return r;
}

uint64_t decode_pcap(const std::string& path, std::ostream& out, uint64_t max_frames) {
  PcapReader reader(path);
  uint64_t frames = 0, decoded = 0;
  while (auto rec = reader.next()) {
    ++frames;
    if (max_frames != 0 && decoded >= max_frames) continue;  // counted, not decoded
    nlohmann::json j = {{"i", frames - 1}, {"t_ns", rec->t_ns},
                        {"frame", summary(parse(Bytes(rec->data.data(), rec->data.size())))}};
    if (rec->orig_len > rec->data.size()) j["frame"]["captured"] = rec->data.size();
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    ++decoded;
  }
  out << nlohmann::json{{"end", true}, {"frames", frames}, {"decoded", decoded},
                        {"torn", reader.torn()}}
             .dump()
      << '\n';
  return decoded;
}

}  // namespace rdmalab::faults
