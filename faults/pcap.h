// A pcap file of the fabric (classic format, little-endian, microseconds, LINKTYPE_ETHERNET),
// as bindings/rdmalab/machines/vmlab/pcap.py writes and reads it.
#pragma once

#include <cstdint>
#include <ctime>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "faults/bytes.h"
#include "faults/fd.h"

namespace rdmalab::faults {

class PcapWriter {
 public:
  // Creates (truncates) the file and writes the global header; throws std::system_error.
  // max_bytes (0: no cap): the file stops growing there; later frames are counted as skipped
  // (a bulk-data scenario's capture stays small).
  explicit PcapWriter(const std::string& path, uint64_t max_bytes = 0);

  // One record; false once a write failed (the file is closed then). when: CLOCK_REALTIME,
  // since pcap readers expect wall-clock time.
  bool write(Bytes frame, const timespec& when);
  const std::string& path() const { return path_; }
  uint64_t frames() const { return frames_; }    // written
  uint64_t skipped() const { return skipped_; }  // not written: past max_bytes

 private:
  bool write_all(const void* data, size_t n);

  std::string path_;
  Fd fd_;
  uint64_t max_bytes_ = 0, bytes_ = 0, frames_ = 0, skipped_ = 0;
};

// Reads a classic pcap file as the switch writes it, and as tcpdump writes one (either byte
// order, microsecond or nanosecond time stamps); Ethernet link type only.
class PcapReader {
 public:
  struct Record {
    uint64_t t_ns = 0;  // the record's time stamp (CLOCK_REALTIME of the writer) in ns
    uint32_t orig_len = 0;
    std::vector<uint8_t> data;  // as captured (orig_len or less)
  };
  // Opens the file and checks its header; throws std::runtime_error naming what is wrong.
  explicit PcapReader(const std::string& path);
  // The next record; nullopt at the end, or at a record cut off by the writer (torn_ says so).
  std::optional<Record> next();
  bool torn() const { return torn_; }

 private:
  uint32_t u32(const uint8_t* p) const;
  std::string path_;
  Fd fd_;
  bool swap_ = false, nanos_ = false, torn_ = false;
};

// One JSON object a line for each frame of a pcap file: {"i", "t_ns", "frame": summary()}, at
// most max_frames of them (0: all); then one line {"end": true, "frames", "decoded", "torn"}.
// Returns the frames decoded; throws std::runtime_error for a file that is not a pcap.
uint64_t decode_pcap(const std::string& path, std::ostream& out, uint64_t max_frames = 0);

}  // namespace rdmalab::faults
