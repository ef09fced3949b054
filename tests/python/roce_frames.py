"""Frames the Python tests send through the fault switch, built byte by byte (the C++ tests'
are faults/test_frames.h): hosts a and b by their MACs, a CM REQ from a to b."""

MAC_A, MAC_B = "52:54:00:12:34:01", "52:54:00:12:34:02"


def roce_cm_req() -> bytes:
    """A CM REQ MAD from a to b as RoCEv2 carries it (UD SEND_ONLY to QP 1, DETH src QP 1)."""
    deth = (0x80010000).to_bytes(4, "big") + (1).to_bytes(4, "big")
    mad = bytes([1, 0x07, 2, 0x03]) + bytes(12) + (0x10).to_bytes(2, "big") + bytes(238)
    bth = bytes([0x64, 0, 0xFF, 0xFF]) + (1).to_bytes(4, "big") + (7).to_bytes(4, "big")
    payload = deth + mad
    udp_len = 8 + len(bth) + len(payload) + 4
    ip = bytes([0x45, 0]) + (20 + udp_len).to_bytes(2, "big") + \
        bytes([0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2])
    udp = (49152).to_bytes(2, "big") + (4791).to_bytes(2, "big") + \
        udp_len.to_bytes(2, "big") + b"\0\0"
    return (bytes.fromhex(MAC_B.replace(":", "")) + bytes.fromhex(MAC_A.replace(":", ""))
            + b"\x08\x00" + ip + udp + bth + payload + b"ICRC")
