#!/usr/bin/env python3
"""dhcp_server.py: a small DHCPv4 server for tests, independent of Strata's client code.

    dhcp_server.py IFACE SERVER_IP CLIENT_IP LEASE_S MODE LOG

Answers DISCOVER with an OFFER of CLIENT_IP/24 and REQUEST with an ACK (lease LEASE_S seconds,
T1 half of it, T2 seven eighths; router and DNS SERVER_IP). MODE changes one thing:
  normal          every request is granted
  nak-first-renewal   the first renewal (a REQUEST carrying ciaddr) gets a NAK
  ignore-unicast  renewals sent to SERVER_IP get no answer (only rebinding broadcasts do)
Each message is one line in LOG: "TYPE ciaddr=A.B.C.D to=DEST-IP -> REPLY".
"""
import socket
import struct
import sys

IN_PKTINFO = 8  # Linux IP_PKTINFO, not exported by Python's socket module


def ip(s):
    return socket.inet_aton(s)


def main():
    iface, server, client, lease, mode, log = sys.argv[1:7]
    lease = int(lease)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, iface.encode())
    s.setsockopt(socket.IPPROTO_IP, IN_PKTINFO, 1)
    s.bind(("0.0.0.0", 67))
    out = open(log, "a", buffering=1)
    out.write("listening\n")
    renewals = 0
    while True:
        data, anc, _, _ = s.recvmsg(2048, 256)
        dest = "?"
        for level, kind, val in anc:
            if level == socket.IPPROTO_IP and kind == IN_PKTINFO:
                dest = socket.inet_ntoa(val[8:12])
        if len(data) < 240 or data[0] != 1 or data[236:240] != b"\x63\x82\x53\x63":
            continue
        xid, ciaddr, chaddr = data[4:8], data[12:16], data[28:44]
        opts, i, kind = data[240:], 0, 0
        while i + 1 < len(opts) and opts[i] != 255:
            if opts[i] == 0:
                i += 1
                continue
            n = opts[i + 1]
            if opts[i] == 53 and n == 1:
                kind = opts[i + 2]
            i += 2 + n
        ci = socket.inet_ntoa(ciaddr)
        if kind == 1:
            reply = 2
        elif kind == 3:
            reply = 5
            if ci != "0.0.0.0":
                renewals += 1
                if mode == "nak-first-renewal" and renewals == 1:
                    reply = 6
                if mode == "ignore-unicast" and dest == server:
                    reply = None
        else:
            continue
        name = {1: "DISCOVER", 3: "REQUEST"}[kind]
        out.write("%s ciaddr=%s to=%s -> %s\n" % (name, ci, dest,
                  {2: "OFFER", 5: "ACK", 6: "NAK", None: "(ignored)"}[reply]))
        if reply is None:
            continue
        m = bytearray(240)
        m[0:4] = b"\x02\x01\x06\x00"
        m[4:8] = xid
        m[12:16] = ciaddr
        if reply != 6:
            m[16:20] = ip(client)
        m[20:24] = ip(server)
        m[28:44] = chaddr
        m[236:240] = b"\x63\x82\x53\x63"
        o = bytes([53, 1, reply, 54, 4]) + ip(server)
        if reply != 6:
            o += bytes([51, 4]) + struct.pack("!I", lease)
            o += bytes([58, 4]) + struct.pack("!I", lease // 2)
            o += bytes([59, 4]) + struct.pack("!I", lease * 7 // 8)
            o += bytes([1, 4]) + ip("255.255.255.0")
            o += bytes([3, 4]) + ip(server) + bytes([6, 4]) + ip(server)
        m += o + b"\xff"
        to = ci if ci != "0.0.0.0" and reply != 6 else "255.255.255.255"
        s.sendto(bytes(m), (to, 68))


main()
