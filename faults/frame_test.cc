#include "faults/frame.h"

#include <gtest/gtest.h>

#include <random>

#include "faults/checksum.h"
#include "faults/test_frames.h"
#include "faults/test_paths.h"

namespace rdmalab::faults {
namespace frame_test {  // its own: the tests compile in batches
namespace {

using namespace testing;  // the frame builders

Frame8 corpus(const std::string& name) {
  return load_hex(std::filesystem::path(corpus_dir()) / (name + ".hex"));
}

TEST(FrameParse, RcSendOnlyToQpn0x12) {
  const Frame8 b = send_only_to_0x12();
  const Frame f = parse(b);
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.eth && f.ip && f.udp && f.bth);
  EXPECT_EQ(f.eth->dst, kMacB);
  EXPECT_EQ(f.eth->src, kMacA);
  EXPECT_EQ(f.eth->ethertype, 0x0800);
  EXPECT_FALSE(f.eth->vlan_tci);
  EXPECT_EQ(f.ip->version, 4);
  EXPECT_EQ(f.ip->header_len, 20u);
  EXPECT_EQ(f.ip->protocol, 17);
  EXPECT_EQ(f.ip->ttl, 64);
  EXPECT_TRUE(f.ip->df);
  EXPECT_EQ(f.ip->length, b.size() - 14);
  EXPECT_EQ(ip_string(*f.ip, true), "10.0.0.1");
  EXPECT_EQ(ip_string(*f.ip, false), "10.0.0.2");
  EXPECT_EQ(f.udp->src_port, 49152);
  EXPECT_EQ(f.udp->dst_port, 4791);
  EXPECT_EQ(f.udp->length, 8 + 12 + 16 + 4);
  EXPECT_EQ(f.bth->off, 42u);
  EXPECT_EQ(f.bth->opcode, 0x04);
  EXPECT_STREQ(bth_opcode_name(f.bth->opcode), "SEND_ONLY");
  EXPECT_STREQ(bth_transport_name(f.bth->opcode), "RC");
  EXPECT_EQ(f.bth->dest_qpn, 0x12u);
  EXPECT_EQ(f.bth->psn, 0x123456u);
  EXPECT_TRUE(f.bth->ack_req);
  EXPECT_EQ(f.bth->pkey, 0xFFFF);
  EXPECT_EQ(f.bth->pad_count, 0);
  EXPECT_FALSE(f.deth || f.aeth || f.reth || f.mad || f.tcp);
  EXPECT_EQ(f.roce_payload_off, 54u);
  EXPECT_EQ(f.roce_payload_len, 16u);
  ASSERT_TRUE(f.icrc_off);
  EXPECT_EQ(*f.icrc_off, b.size() - 4);
  EXPECT_TRUE(icrc_ok(b, f));
}

TEST(FrameParse, CmDrepMadToQpn1) {
  const Frame8 b = cm_drep();
  const Frame f = parse(b);
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.bth && f.deth && f.mad);
  EXPECT_EQ(f.bth->opcode, 0x64);
  EXPECT_STREQ(bth_transport_name(0x64), "UD");
  EXPECT_STREQ(bth_opcode_name(0x64), "SEND_ONLY");
  EXPECT_EQ(f.bth->dest_qpn, 1u);
  EXPECT_EQ(f.bth->psn, 7u);
  EXPECT_EQ(f.deth->qkey, 0x80010000u);
  EXPECT_EQ(f.deth->src_qpn, 1u);
  EXPECT_EQ(f.mad->off, f.deth->off + 8);
  EXPECT_EQ(f.mad->len, 256u);
  EXPECT_EQ(f.mad->base_version, 1);
  EXPECT_EQ(f.mad->mgmt_class, 0x07);
  EXPECT_EQ(f.mad->class_version, 2);
  EXPECT_EQ(f.mad->method, 0x03);
  EXPECT_EQ(f.mad->tid, 0x0000000211223344ull);
  EXPECT_EQ(f.mad->attr_id, 0x16);
  EXPECT_STREQ(cm_attr_name(f.mad->attr_id), "DREP");
  EXPECT_EQ(f.mad->local_comm_id, 0x0A0B0C0Du);
  EXPECT_EQ(f.mad->remote_comm_id, 0x01020304u);
  EXPECT_TRUE(icrc_ok(b, f));
}

TEST(FrameParse, CmReqHasNoRemoteCommId) {
  const Frame f = parse(cm_mad(0x10, 0x55, 0x66));
  ASSERT_TRUE(f.mad);
  EXPECT_EQ(f.mad->local_comm_id, 0x55u);
  EXPECT_FALSE(f.mad->remote_comm_id);
}

// The QPNs and the REJ reason at their IBTA offsets in the CM message (after the MAD header).
static Frame8 with_cm_field(Frame8 b, size_t at, std::initializer_list<uint8_t> bytes) {
  const Frame f = parse(b);
  size_t i = f.mad->off + 24 + at;
  for (uint8_t v : bytes) b[i++] = v;
  return b;
}

TEST(FrameParse, CmReqRepDreqQpnsAndRejReason) {
  const Frame req = parse(with_cm_field(cm_mad(0x10, 1, 0), 32, {0x00, 0x00, 0x11, 0x7F}));
  EXPECT_EQ(req.mad->local_qpn, 0x11u);  // the low byte is the Responder Resources field's
  const Frame rep = parse(with_cm_field(cm_mad(0x13, 2, 1), 12, {0x01, 0x02, 0x03, 0xFF}));
  EXPECT_EQ(rep.mad->local_qpn, 0x010203u);
  EXPECT_FALSE(rep.mad->remote_qpn);
  const Frame dreq = parse(with_cm_field(cm_mad(0x15, 1, 2), 8, {0x00, 0x00, 0x12, 0x00}));
  EXPECT_EQ(dreq.mad->remote_qpn, 0x12u);
  const Frame rej = parse(with_cm_field(cm_mad(0x12, 0, 1), 10, {0x00, 0x0A}));
  EXPECT_EQ(rej.mad->rej_reason, 10);  // stale connection
  EXPECT_FALSE(parse(cm_drep()).mad->rej_reason);
  const nlohmann::json j = summary(rej);
  EXPECT_EQ(j["rej_reason"], 10);
  EXPECT_EQ(summary(req)["local_qpn"], 0x11);
}

TEST(FrameParse, AcknowledgeWithRnrNak) {
  const Frame8 b = rnr_nak();
  const Frame f = parse(b);
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.bth && f.aeth);
  EXPECT_STREQ(bth_opcode_name(f.bth->opcode), "ACKNOWLEDGE");
  EXPECT_FALSE(f.bth->ack_req);
  EXPECT_EQ(f.aeth->syndrome, 0x2E);
  EXPECT_STREQ(aeth_syndrome_name(f.aeth->syndrome), "RNR_NAK");
  EXPECT_EQ(f.aeth->msn, 5u);
  EXPECT_EQ(f.roce_payload_len, 0u);
  EXPECT_EQ(f.eth->src, kMacB);
  EXPECT_TRUE(icrc_ok(b, f));
}

TEST(FrameParse, AethSyndromeNames) {
  EXPECT_STREQ(aeth_syndrome_name(0x1F), "ACK");  // credits 31 (what rxe sends)
  EXPECT_STREQ(aeth_syndrome_name(0x20), "RNR_NAK");
  EXPECT_STREQ(aeth_syndrome_name(0x60), "NAK_SEQ");
  EXPECT_STREQ(aeth_syndrome_name(0x61), "NAK_INV_REQ");
  EXPECT_STREQ(aeth_syndrome_name(0x62), "NAK_REM_ACCESS");
  EXPECT_STREQ(aeth_syndrome_name(0x63), "NAK_REM_OP");
  EXPECT_STREQ(aeth_syndrome_name(0x64), "NAK_INV_RD_REQ");
  EXPECT_EQ(aeth_syndrome_name(0x40), nullptr);  // type 10 is reserved
}

TEST(FrameParse, UdSendWithDethAndPad) {
  const Frame8 b = ud_send();
  const Frame f = parse(b);
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.bth && f.deth);
  EXPECT_EQ(f.bth->opcode, 0x64);
  EXPECT_EQ(f.bth->dest_qpn, 0x33u);
  EXPECT_EQ(f.bth->pad_count, 1);
  EXPECT_EQ(f.deth->qkey, 0x11112222u);
  EXPECT_EQ(f.deth->src_qpn, 0x44u);
  EXPECT_EQ(f.roce_payload_len, 7u);
  EXPECT_FALSE(f.mad);  // not QP 1
  EXPECT_TRUE(icrc_ok(b, f));
}

TEST(FrameParse, OpcodeTableFollowsIbta) {
  const std::pair<uint8_t, const char*> rc[] = {{0x00, "SEND_FIRST"},
                                                {0x03, "SEND_LAST_WITH_IMMEDIATE"},
                                                {0x06, "RDMA_WRITE_FIRST"},
                                                {0x0A, "RDMA_WRITE_ONLY"},
                                                {0x0B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE"},
                                                {0x0C, "RDMA_READ_REQUEST"},
                                                {0x0D, "RDMA_READ_RESPONSE_FIRST"},
                                                {0x10, "RDMA_READ_RESPONSE_ONLY"},
                                                {0x11, "ACKNOWLEDGE"},
                                                {0x12, "ATOMIC_ACKNOWLEDGE"},
                                                {0x13, "COMPARE_SWAP"},
                                                {0x14, "FETCH_ADD"},
                                                {0x16, "SEND_LAST_WITH_INVALIDATE"},
                                                {0x17, "SEND_ONLY_WITH_INVALIDATE"}};
  for (const auto& [op, name] : rc) EXPECT_STREQ(bth_opcode_name(op), name) << int(op);
  EXPECT_STREQ(bth_opcode_name(0x2A), "RDMA_WRITE_ONLY");  // UC
  EXPECT_EQ(bth_opcode_name(0x2C), nullptr);               // UC has no RDMA READ
  EXPECT_STREQ(bth_opcode_name(0x65), "SEND_ONLY_WITH_IMMEDIATE");
  EXPECT_EQ(bth_opcode_name(0x60), nullptr);  // UD has SEND_ONLY only
  EXPECT_STREQ(bth_opcode_name(0x81), "CNP");
  EXPECT_STREQ(bth_transport_name(0xA4), "XRC");
  EXPECT_EQ(bth_opcode_name(0x15), nullptr);  // RESYNC is RD only
}

TEST(FrameParse, RdmaWriteOnlyWithImmediateHasRethThenImmDt) {
  Roce r;
  r.opcode = 0x0B;
  r.ext = Buf{}.u64(0x1000).u32(0xABCD).u32(8).u32(0xCAFEBABE).b;
  r.payload = {1, 2, 3, 4, 5, 6, 7, 8};
  const Frame f = parse(roce_v4(r));
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.reth && f.immdt);
  EXPECT_EQ(f.reth->va, 0x1000u);
  EXPECT_EQ(f.reth->rkey, 0xABCDu);
  EXPECT_EQ(f.reth->dma_length, 8u);
  EXPECT_EQ(*f.immdt, 0xCAFEBABEu);
  EXPECT_EQ(f.roce_payload_len, 8u);
}

TEST(FrameParse, TcpSyn) {
  const Frame8 b = tcp_syn();
  const Frame f = parse(b);
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.tcp);
  EXPECT_EQ(f.tcp->src_port, 46658);
  EXPECT_EQ(f.tcp->dst_port, 7471);
  EXPECT_EQ(f.tcp->seq, 1000u);
  EXPECT_EQ(f.tcp->ack, 0u);
  EXPECT_EQ(f.tcp->data_offset, 7);
  EXPECT_EQ(f.tcp->flags, tcp_flag::SYN);
  EXPECT_EQ(tcp_flags_string(f.tcp->flags), "SYN");
  EXPECT_EQ(f.tcp->window, 1004);
  EXPECT_EQ(f.tcp->payload_len, 0u);
  EXPECT_FALSE(f.mpa || f.fpdu || f.bth);
  EXPECT_TRUE(tcp_checksum_ok(b, f));
}

TEST(FrameParse, TcpFinAck) {
  const Frame f = parse(tcp_fin_ack());
  ASSERT_TRUE(f.tcp);
  EXPECT_EQ(f.tcp->flags, tcp_flag::FIN | tcp_flag::ACK);
  EXPECT_EQ(tcp_flags_string(f.tcp->flags), "FIN|ACK");
  EXPECT_EQ(f.tcp->ack, 3000u);
  EXPECT_EQ(f.stop, Stop::kComplete);
}

TEST(FrameParse, MpaRequest) {
  const Frame f = parse(mpa_request());
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.mpa);
  EXPECT_TRUE(f.mpa->request);
  EXPECT_EQ(f.mpa->off, f.tcp->payload_off);
  EXPECT_EQ(f.mpa->flags, 0x10);
  EXPECT_EQ(f.mpa->revision, 2);
  EXPECT_EQ(f.mpa->pd_len, 4);
  EXPECT_TRUE(f.mpa->pd_complete);
  EXPECT_FALSE(f.fpdu);
}

TEST(FrameParse, FpduWithRdmapSend) {
  const Frame8 b = fpdu_send_frame();
  const Frame f = parse(b);
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.fpdu);
  EXPECT_EQ(f.fpdu_count, 1u);
  EXPECT_EQ(f.fpdu->off, f.tcp->payload_off);
  EXPECT_EQ(f.fpdu->ulpdu_len, 18 + 64);
  EXPECT_EQ(f.fpdu->len, 88u);
  EXPECT_FALSE(f.fpdu->tagged);
  EXPECT_TRUE(f.fpdu->last);
  EXPECT_EQ(f.fpdu->ddp_version, 1);
  EXPECT_EQ(f.fpdu->rdmap_version, 1);
  EXPECT_EQ(f.fpdu->rdmap_opcode, 3);
  EXPECT_STREQ(rdmap_opcode_name(f.fpdu->rdmap_opcode), "SEND");
  EXPECT_EQ(f.fpdu->qn, 0u);
  EXPECT_EQ(f.fpdu->msn, 1u);
  EXPECT_EQ(f.fpdu->mo, 0u);
  EXPECT_EQ(f.fpdu->header_len, 18u);
  EXPECT_EQ(f.fpdu->crc, 0u);
}

TEST(FrameParse, TwoFpdusInOneSegment) {
  Frame8 two = fpdu_send(5, 1);
  const Frame8 second = fpdu_send(10, 2);
  two.insert(two.end(), second.begin(), second.end());
  const Frame f = parse(fpdu_segment(two));
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.fpdu);
  EXPECT_EQ(f.fpdu_count, 2u);
  EXPECT_EQ(f.fpdu->msn, 1u);
  EXPECT_EQ(f.fpdu->len, 32u);  // 2 + 23 + pad 3 + CRC 4
}

TEST(FrameParse, SegmentStartingMidFpduIsUnaligned) {
  const Frame8 whole = fpdu_send(200, 1);
  for (size_t cut : {1u, 2u, 7u, 50u, 100u}) {
    const Frame8 tail(whole.begin() + static_cast<long>(cut), whole.end());
    const Frame f = parse(fpdu_segment(tail));
    EXPECT_EQ(f.stop, Stop::kUnaligned) << cut;
    EXPECT_FALSE(f.fpdu) << cut;
    ASSERT_TRUE(f.tcp);
    EXPECT_EQ(f.stop_offset, f.tcp->payload_off);
  }
  // The head of an FPDU whose rest is in the next segment cannot be checked either.
  const Frame8 head(whole.begin(), whole.begin() + 100);
  EXPECT_EQ(parse(fpdu_segment(head)).stop, Stop::kUnaligned);
}

TEST(FrameParse, VlanTagAndOtherEthertypes) {
  Frame8 b = send_only_to_0x12();
  const Frame8 tag = {0x81, 0x00, 0x20, 0x05};
  b.insert(b.begin() + 12, tag.begin(), tag.end());
  const Frame f = parse(b);
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.eth && f.bth);
  EXPECT_EQ(f.eth->vlan_tci, 0x2005);
  EXPECT_EQ(f.eth->len, 18u);
  EXPECT_EQ(f.bth->dest_qpn, 0x12u);

  const Frame arp = parse(arp_request());
  EXPECT_EQ(arp.stop, Stop::kNotParsed);
  EXPECT_EQ(arp.why, "ARP");
  EXPECT_EQ(arp.stop_offset, 14u);
  EXPECT_EQ(parse(unicast(kMacB, kMacA, 1)).stop, Stop::kNotParsed);
}

TEST(FrameParse, BadHeadersAreNamed) {
  Frame8 ihl = send_only_to_0x12();
  ihl[14] = 0x44;
  Frame f = parse(ihl);
  EXPECT_EQ(f.stop, Stop::kBadHeader);
  EXPECT_EQ(f.stop_offset, 14u);
  EXPECT_NE(f.why.find("IHL"), std::string::npos);

  Frame8 udp_len = send_only_to_0x12();
  udp_len[38] = 0;
  udp_len[39] = 4;
  f = parse(udp_len);
  EXPECT_EQ(f.stop, Stop::kBadHeader);
  EXPECT_EQ(f.stop_offset, 34u);

  Frame8 doff = tcp_fin_ack();
  doff[34 + 12] = 0x40;
  f = parse(doff);
  EXPECT_EQ(f.stop, Stop::kBadHeader);
  EXPECT_NE(f.why.find("data offset"), std::string::npos);

  Frame8 frag = send_only_to_0x12();
  frag[20] = 0x20;  // MF
  f = parse(frag);
  EXPECT_EQ(f.stop, Stop::kNotParsed);
  EXPECT_EQ(f.why, "IPv4 fragment");
  EXPECT_FALSE(f.udp);

  Frame8 unknown_op = send_only_to_0x12();
  unknown_op[42] = 0x1F;
  f = parse(unknown_op);
  EXPECT_EQ(f.stop, Stop::kNotParsed);
  ASSERT_TRUE(f.bth);
  EXPECT_EQ(f.bth->opcode, 0x1F);
}

// Cut at every length: no crash, and the stop names the layer that was cut.
TEST(FrameParse, EveryPrefixStopsWhereItWasCut) {
  const std::vector<Frame8> frames = {send_only_to_0x12(), cm_drep(),        rnr_nak(),
                                      ud_send(),           tcp_syn(),        tcp_fin_ack(),
                                      mpa_request(),       fpdu_send_frame()};
  for (const Frame8& whole : frames) {
    ASSERT_EQ(parse(whole).stop, Stop::kComplete);
    for (size_t n = 0; n < whole.size(); ++n) {
      const Frame f = parse(Bytes(whole.data(), n));
      EXPECT_EQ(f.len, n);
      EXPECT_EQ(f.stop, Stop::kTruncated) << n;
      EXPECT_EQ(f.stop_offset, n < 14 ? 0u : 14u) << n << " " << f.why;
      EXPECT_FALSE(f.why.empty());
    }
  }
}

// Shorter datagrams whose IP and UDP lengths agree: the stop moves inward layer by layer.
TEST(FrameParse, ShortRoceDatagramsStopAtTheirInnerLayer) {
  const Frame8 whole = cm_drep();
  const auto cut = [&](size_t udp_payload) {
    Frame8 b(whole.begin(), whole.begin() + 42 + static_cast<long>(udp_payload));
    put16_at(b, 16, static_cast<uint16_t>(20 + 8 + udp_payload));
    put16_at(b, 38, static_cast<uint16_t>(8 + udp_payload));
    return parse(b);
  };
  Frame f = cut(15);
  EXPECT_EQ(f.stop, Stop::kTruncated);
  EXPECT_EQ(f.stop_offset, 42u);
  EXPECT_NE(f.why.find("BTH"), std::string::npos);
  f = cut(23);
  EXPECT_EQ(f.stop_offset, 54u);
  EXPECT_NE(f.why.find("DETH"), std::string::npos);
  f = cut(12 + 8 + 23 + 4);
  EXPECT_EQ(f.stop_offset, 62u);
  EXPECT_NE(f.why.find("MAD header"), std::string::npos);
  f = cut(12 + 8 + 31 + 4);
  EXPECT_EQ(f.stop, Stop::kTruncated);
  EXPECT_NE(f.why.find("communication IDs"), std::string::npos);
  ASSERT_TRUE(f.mad);
  EXPECT_EQ(f.mad->attr_id, 0x16);
  f = cut(12 + 8 + 32 + 4);
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
}

TEST(FrameParse, GarbageNeverCrashes) {
  std::mt19937 rng(12345);
  std::vector<Frame8> seeds = {send_only_to_0x12(), cm_drep(), fpdu_send_frame(), mpa_request()};
  for (const char* name : {"roce_v6_rc_send_only", "siw_fpdu_terminate", "ipv6_nd_solicit"})
    seeds.push_back(corpus(name));
  for (int i = 0; i < 20000; ++i) {
    Frame8 b;
    if (i % 2 == 0) {
      b.resize(rng() % 300);
      for (auto& x : b) x = static_cast<uint8_t>(rng());
      if (b.size() > 14 && i % 4 == 0) b[12] = 0x08, b[13] = 0;  // mostly IPv4 then
    } else {
      b = seeds[rng() % seeds.size()];
      for (int k = 0; k < 4; ++k) b[rng() % b.size()] ^= static_cast<uint8_t>(rng());
      b.resize(rng() % (b.size() + 1));
    }
    const Frame f = parse(b);
    EXPECT_LE(f.stop_offset, b.size());
    if (f.icrc_off) {
      EXPECT_LE(*f.icrc_off + 4, b.size());
      icrc_compute(b, f);
    }
    if (f.fpdu) {
      EXPECT_LE(f.fpdu->off + f.fpdu->len, b.size());
    }
    summary(f);
  }
}

// Real frames from the VM lab (corpus/*.hex): rxe RoCEv2 over IPv4 and IPv6, siw iWARP.
TEST(FrameParse, RealRxeFrames) {
  const Frame8 drep = corpus("roce_v4_cm_drep");
  Frame f = parse(drep);
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.mad);
  EXPECT_EQ(f.bth->opcode, 0x64);
  EXPECT_EQ(f.bth->dest_qpn, 1u);
  EXPECT_EQ(f.deth->qkey, 0x80010000u);
  EXPECT_EQ(f.mad->attr_id, 0x16);
  EXPECT_EQ(f.mad->tid, 0x000000021B3ACF3Dull);
  EXPECT_EQ(f.mad->local_comm_id, 0xAE870D5Au);
  EXPECT_EQ(f.mad->remote_comm_id, 0x3DCF3A1Bu);
  EXPECT_EQ(f.udp->checksum, 0);  // rxe sends no UDP checksum

  const Frame req = parse(corpus("roce_v4_cm_req"));
  ASSERT_TRUE(req.mad);
  EXPECT_EQ(req.mad->local_comm_id, 0x3DCF3A1Bu);  // the DREP's remote ID

  f = parse(corpus("roce_v4_rc_send_only"));
  EXPECT_EQ(f.bth->dest_qpn, 21u);
  EXPECT_EQ(f.bth->psn, 10459786u);
  f = parse(corpus("roce_v4_rc_ack"));
  ASSERT_TRUE(f.aeth);
  EXPECT_STREQ(aeth_syndrome_name(f.aeth->syndrome), "ACK");
  EXPECT_EQ(f.aeth->msn, 1u);

  f = parse(corpus("roce_v6_rc_send_only"));
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.ip && f.bth);
  EXPECT_EQ(f.ip->version, 6);
  EXPECT_EQ(ip_string(*f.ip, true), "fe80::5054:ff:fe12:3401");
  EXPECT_EQ(f.bth->dest_qpn, 17u);
  EXPECT_EQ(f.bth->psn, 256u);

  EXPECT_EQ(parse(corpus("ipv6_nd_solicit")).stop, Stop::kNotParsed);      // ICMPv6
  EXPECT_EQ(parse(corpus("ipv6_hop_by_hop_mld")).stop, Stop::kNotParsed);  // extension header
}

TEST(FrameParse, RealSiwFrames) {
  Frame f = parse(corpus("siw_mpa_request"));
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.mpa);
  EXPECT_TRUE(f.mpa->request);
  EXPECT_EQ(f.mpa->flags, 0x10);  // enhanced (MPA v2), no CRC, no markers
  EXPECT_EQ(f.mpa->revision, 2);
  EXPECT_EQ(f.mpa->pd_len, 4);
  EXPECT_EQ(f.tcp->dst_port, 7471);
  f = parse(corpus("siw_mpa_reply"));
  ASSERT_TRUE(f.mpa);
  EXPECT_FALSE(f.mpa->request);

  f = parse(corpus("siw_fpdu_send"));
  EXPECT_EQ(f.stop, Stop::kComplete) << f.why;
  ASSERT_TRUE(f.fpdu);
  EXPECT_EQ(f.fpdu->ulpdu_len, 82);
  EXPECT_EQ(f.fpdu->rdmap_opcode, 3);
  EXPECT_EQ(f.fpdu->msn, 1u);
  EXPECT_EQ(f.fpdu->crc, 0u);  // siw's default: no MPA CRC

  f = parse(corpus("siw_fpdu_terminate"));
  ASSERT_TRUE(f.fpdu);
  EXPECT_STREQ(rdmap_opcode_name(f.fpdu->rdmap_opcode), "TERMINATE");
  EXPECT_EQ(f.fpdu->qn, 2u);  // the Terminate queue

  EXPECT_EQ(parse(corpus("siw_tcp_syn")).tcp->flags, tcp_flag::SYN);
  EXPECT_EQ(parse(corpus("siw_tcp_fin_ack")).tcp->flags, tcp_flag::FIN | tcp_flag::ACK);
  EXPECT_EQ(parse(corpus("siw_tcp_rst_ack")).tcp->flags, tcp_flag::RST | tcp_flag::ACK);
}

TEST(FrameParse, SummaryNamesTheProtocolFields) {
  const nlohmann::json s = summary(parse(cm_drep()));
  EXPECT_EQ(s["proto"], "roce");
  EXPECT_EQ(s["opcode"], "SEND_ONLY");
  EXPECT_EQ(s["transport"], "UD");
  EXPECT_EQ(s["cm"], "DREP");
  EXPECT_EQ(s["dest_qpn"], 1);
  EXPECT_EQ(s["src"], "52:54:00:12:34:01");
  EXPECT_EQ(s["stop"], "complete");
  const nlohmann::json t = summary(parse(fpdu_send_frame()));
  EXPECT_EQ(t["proto"], "iwarp");
  EXPECT_EQ(t["rdmap_opcode"], "SEND");
  EXPECT_EQ(t["tcp_flags"], "PSH|ACK");
}

}  // namespace
}  // namespace frame_test
}  // namespace rdmalab::faults
