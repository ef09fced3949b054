// A pcap file of the fabric (classic format, little-endian, microseconds, LINKTYPE_ETHERNET),
// as lab/vmlab/pcap.py writes and reads it.
#pragma once

#include <ctime>
#include <string>

#include "faults/bytes.h"
#include "faults/fd.h"

namespace rdmalab::faults {

class PcapWriter {
 public:
  // Creates (truncates) the file and writes the global header; throws std::system_error.
  explicit PcapWriter(const std::string& path);

  // One record; false once a write failed (the file is closed then). when: CLOCK_REALTIME,
  // since pcap readers expect wall-clock time.
  bool write(Bytes frame, const timespec& when);
  const std::string& path() const { return path_; }

 private:
  bool write_all(const void* data, size_t n);

  std::string path_;
  Fd fd_;
};

}  // namespace rdmalab::faults
