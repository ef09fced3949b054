#include "faults/checksum.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "faults/corrupt.h"
#include "faults/test_frames.h"
#include "faults/test_paths.h"

namespace rdmalab::faults {
namespace {

using namespace testing;

Frame8 corpus(const std::string& name) {
  return load_hex(std::filesystem::path(corpus_dir()) / (name + ".hex"));
}

Frame8 str_bytes(const std::string& s) {
  return Frame8(s.begin(), s.end());
}

TEST(Checksum, CrcCheckValues) {
  // The catalogued check values of CRC-32 and CRC-32C over "123456789".
  const Frame8 digits = str_bytes("123456789");
  EXPECT_EQ(~crc32_ieee(0xFFFFFFFFu, digits), 0xCBF43926u);
  EXPECT_EQ(ref_crc32(digits), 0xCBF43926u);
  EXPECT_EQ(~crc32c(0xFFFFFFFFu, digits), 0xE3069283u);
  EXPECT_EQ(ref_crc32c(digits), 0xE3069283u);
}

TEST(Checksum, MaskedLrhSeedIsTheOneRxeStartsFrom) {
  // rxe_icrc.c seeds its CRC with 0xdebb20e3: 8 bytes of 0xFF through a preset register.
  const Frame8 lrh(8, 0xFF);
  EXPECT_EQ(crc32_ieee(0xFFFFFFFFu, lrh), 0xDEBB20E3u);
}

// The ICRC of frames built here with the test's own bitwise CRC matches the library's.
TEST(Icrc, MatchesTheSpecDefinition) {
  for (const Frame8& b : {send_only_to_0x12(), cm_drep(), rnr_nak(), ud_send()}) {
    const Frame f = parse(b);
    ASSERT_TRUE(f.icrc_off);
    EXPECT_EQ(icrc_compute(b, f), ref_icrc_v4(b));
    EXPECT_TRUE(icrc_ok(b, f));
  }
}

// Frames captured from rxe (kernel 6.1) carry the ICRC the kernel computed.
TEST(Icrc, VerifiesOnRealRxeFramesV4AndV6) {
  for (const char* name : {"roce_v4_cm_req", "roce_v4_cm_rep", "roce_v4_cm_rtu", "roce_v4_cm_dreq",
                           "roce_v4_cm_drep", "roce_v4_cm_rej", "roce_v4_rc_send_only",
                           "roce_v4_rc_ack", "roce_v6_rc_send_only", "roce_v6_rc_ack"}) {
    const Frame8 b = corpus(name);
    const Frame f = parse(b);
    ASSERT_TRUE(f.bth) << name;
    EXPECT_TRUE(icrc_ok(b, f)) << name;
    EXPECT_TRUE(udp_checksum_ok(b, f)) << name;
    if (f.ip->version == 4) {
      EXPECT_TRUE(ipv4_checksum_ok(b, f)) << name;
    }
  }
  const Frame8 drep = corpus("roce_v4_cm_drep");  // ends 3e cd 6d 19
  EXPECT_EQ(icrc_compute(drep, parse(drep)), 0x196DCD3Eu);
}

TEST(Icrc, MasksTheFieldsRoutersChange) {
  Frame8 b = send_only_to_0x12();
  const uint32_t before = *icrc_compute(b, parse(b));
  b[15] = 0x28;      // TOS
  b[22] = 3;         // TTL
  b[42 + 4] = 0xC0;  // FECN, BECN
  EXPECT_EQ(icrc_compute(b, parse(b)), before);
  b[42 + 7] ^= 1;  // dest QPN is covered
  EXPECT_NE(icrc_compute(b, parse(b)), before);
}

TEST(Checksum, RealSiwFramesVerify) {
  for (const char* name : {"siw_tcp_syn", "siw_mpa_request", "siw_fpdu_send", "siw_tcp_rst_ack"}) {
    const Frame8 b = corpus(name);
    const Frame f = parse(b);
    EXPECT_TRUE(ipv4_checksum_ok(b, f)) << name;
    EXPECT_TRUE(tcp_checksum_ok(b, f)) << name;
  }
}

TEST(Checksum, UdpChecksumWhenPresent) {
  const Frame8 b = ud_send(/*udp_checksum=*/true);
  const Frame f = parse(b);
  ASSERT_NE(f.udp->checksum, 0);
  EXPECT_TRUE(udp_checksum_ok(b, f));
  EXPECT_TRUE(icrc_ok(b, f));
}

TEST(Checksum, MpaCrcIsCrc32cOverTheFpdu) {
  const Frame8 b = fpdu_send_frame(/*with_crc=*/true);
  const Frame f = parse(b);
  ASSERT_TRUE(f.fpdu);
  EXPECT_NE(f.fpdu->crc, 0u);
  EXPECT_EQ(mpa_crc(b, f), f.fpdu->crc);
}

TEST(Corrupt, BthByteGetsFreshIcrcSoRxeSeesIt) {
  Frame8 b = corpus("roce_v4_cm_drep");
  const Frame8 orig = b;
  const Frame f = parse(b);
  const CorruptResult r = corrupt(b, f, {Layer::kBth, 7, 0x03});
  ASSERT_TRUE(r.applied);
  EXPECT_EQ(r.frame_offset, f.bth->off + 7);
  EXPECT_EQ(b[r.frame_offset], orig[r.frame_offset] ^ 0x03);
  EXPECT_EQ(r.recomputed, (std::vector<std::string>{"icrc", "ipv4"}));  // UDP checksum 0 stays 0
  const Frame g = parse(b);
  EXPECT_EQ(g.bth->dest_qpn, 1u ^ 0x03u);
  EXPECT_TRUE(icrc_ok(b, g));
  EXPECT_TRUE(ipv4_checksum_ok(b, g));
  EXPECT_EQ(g.udp->checksum, 0);
  EXPECT_NE(b, orig);
}

TEST(Corrupt, WorksOverIpv6AndWithAUdpChecksum) {
  Frame8 v6 = corpus("roce_v6_rc_send_only");
  corrupt(v6, parse(v6), {Layer::kPayload, 3, 0xFF});
  EXPECT_TRUE(icrc_ok(v6, parse(v6)));

  Frame8 b = ud_send(/*udp_checksum=*/true);
  const CorruptResult r = corrupt(b, parse(b), {Layer::kDeth, 0, 0x80});
  EXPECT_EQ(r.recomputed, (std::vector<std::string>{"icrc", "udp", "ipv4"}));
  const Frame g = parse(b);
  EXPECT_EQ(g.deth->qkey, 0x91112222u);
  EXPECT_TRUE(icrc_ok(b, g));
  EXPECT_TRUE(udp_checksum_ok(b, g));
}

TEST(Corrupt, TheIcrcItselfStaysBad) {
  Frame8 b = cm_drep();
  const CorruptResult r = corrupt(b, parse(b), {Layer::kIcrc, 0, 0xFF});
  EXPECT_EQ(r.recomputed, (std::vector<std::string>{"ipv4"}));
  EXPECT_FALSE(icrc_ok(b, parse(b)));
}

TEST(Corrupt, IpLayerGetsOnlyItsOwnChecksum) {
  Frame8 b = send_only_to_0x12();
  CorruptResult r = corrupt(b, parse(b), {Layer::kIp, 19, 0x01});  // destination address
  EXPECT_EQ(r.recomputed, (std::vector<std::string>{"ipv4"}));
  EXPECT_TRUE(ipv4_checksum_ok(b, parse(b)));
  EXPECT_FALSE(icrc_ok(b, parse(b)));  // the ICRC covers addresses: rxe drops it there

  Frame8 c = send_only_to_0x12();
  r = corrupt(c, parse(c), {Layer::kIp, 10, 0x01});  // the checksum field itself
  EXPECT_TRUE(r.recomputed.empty());
  EXPECT_FALSE(ipv4_checksum_ok(c, parse(c)));

  Frame8 e = send_only_to_0x12();
  r = corrupt(e, parse(e), {Layer::kEth, 0, 0x02});
  EXPECT_TRUE(r.recomputed.empty());
}

TEST(Corrupt, IwarpRecomputesTcpAndOnlyACrcThatIsThere) {
  Frame8 b = corpus("siw_fpdu_send");
  CorruptResult r = corrupt(b, parse(b), {Layer::kRdmap, 0, 0x06});  // Send -> Send with SE
  EXPECT_EQ(r.recomputed, (std::vector<std::string>{"tcp", "ipv4"}));
  Frame g = parse(b);
  EXPECT_STREQ(rdmap_opcode_name(g.fpdu->rdmap_opcode), "SEND_WITH_SE");
  EXPECT_EQ(g.fpdu->crc, 0u);
  EXPECT_TRUE(tcp_checksum_ok(b, g));

  Frame8 c = fpdu_send_frame(/*with_crc=*/true);
  r = corrupt(c, parse(c), {Layer::kUlpPayload, 5, 0xFF});
  EXPECT_EQ(r.recomputed, (std::vector<std::string>{"mpa_crc", "tcp", "ipv4"}));
  g = parse(c);
  Frame8 fpdu(c.begin() + static_cast<long>(g.fpdu->off),
              c.begin() + static_cast<long>(g.fpdu->off + g.fpdu->len - 4));
  EXPECT_EQ(g.fpdu->crc, ref_crc32c(fpdu));
  EXPECT_TRUE(tcp_checksum_ok(c, g));
}

TEST(Corrupt, NothingWhereTheLayerOrByteIsMissing) {
  Frame8 b = send_only_to_0x12();
  const Frame8 orig = b;
  EXPECT_FALSE(corrupt(b, parse(b), {Layer::kDeth, 0, 0xFF}).applied);
  EXPECT_FALSE(corrupt(b, parse(b), {Layer::kBth, 12, 0xFF}).applied);
  EXPECT_FALSE(corrupt(b, parse(b), {Layer::kTcp, 0, 0xFF}).applied);
  EXPECT_EQ(b, orig);
  EXPECT_EQ(layer_from_name("bth"), Layer::kBth);
  EXPECT_EQ(layer_from_name("ulp_payload"), Layer::kUlpPayload);
  EXPECT_FALSE(layer_from_name("lrh"));
}

}  // namespace
}  // namespace rdmalab::faults
