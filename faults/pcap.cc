#include "faults/pcap.h"

#include <fcntl.h>

#include <array>
#include <cerrno>
#include <system_error>

namespace rdmalab::faults {
namespace {

constexpr uint32_t kMagic = 0xA1B2C3D4, kSnapLen = 65536, kLinkTypeEthernet = 1;

template <size_t N>
void le(std::array<uint8_t, N>& b, size_t off, uint32_t v, size_t width = 4) {
  for (size_t i = 0; i < width; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

PcapWriter::PcapWriter(const std::string& path, uint64_t max_bytes)
    : path_(path),
      fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)),
      max_bytes_(max_bytes) {
  if (!fd_) throw std::system_error(errno, std::generic_category(), "pcap " + path);
  std::array<uint8_t, 24> h{};
  le(h, 0, kMagic);
  le(h, 4, 2, 2);  // version 2.4
  le(h, 6, 4, 2);
  le(h, 16, kSnapLen);
  le(h, 20, kLinkTypeEthernet);
  if (!write_all(h.data(), h.size()))
    throw std::system_error(errno, std::generic_category(), "pcap header " + path);
  bytes_ = h.size();
}

bool PcapWriter::write(Bytes frame, const timespec& when) {
  if (!fd_) return false;
  const size_t n = frame.size() < kSnapLen ? frame.size() : kSnapLen;
  if (max_bytes_ != 0 && bytes_ + 16 + n > max_bytes_) {
    ++skipped_;
    return true;
  }
  std::array<uint8_t, 16> h{};
  le(h, 0, static_cast<uint32_t>(when.tv_sec));
  le(h, 4, static_cast<uint32_t>(when.tv_nsec / 1000));
  le(h, 8, static_cast<uint32_t>(n));
  le(h, 12, static_cast<uint32_t>(frame.size()));
  if (write_all(h.data(), h.size()) && write_all(frame.data(), n)) {
    bytes_ += 16 + n;
    ++frames_;
    return true;
  }
  fd_.reset();
  return false;
}

bool PcapWriter::write_all(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_.get(), p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace rdmalab::faults
