"""Does this network namespace have any nf_tables tables of the given families? One netlink dump.

Why not pyroute2 here: importing it costs ~130 ms (its package imports every netlink family and
asyncio), which was half of the CNI plugin's ADD. Listing tables needs one NFT_MSG_GETTABLE dump
(linux/netfilter/nf_tables.h, nfnetlink framing per linux/netfilter/nfnetlink.h), so this module
answers only "are there tables?"; reading chains and rules stays with pyroute2, and callers fall
back to it whenever tables exist.
Invariant: never raises for a kernel without nf_tables (the answer is "none"); other socket
errors propagate as OSError.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_GETTABLE = 1
NFNETLINK_V0 = 0
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NFGENMSG = struct.Struct("=BBH")  # family, version, res_id (big-endian on the wire; unused)
_NLMSG_ERRNO = struct.Struct("=i")
_RECV_SIZE = 65536
_TIMEOUT = 5.0


def table_families() -> list[int]:
    """The nf_tables family (NFPROTO_*) of every table in the current namespace, in dump order."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    except OSError as exc:
        if exc.errno in (errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT):
            return []
        raise
    with sock:
        sock.settimeout(_TIMEOUT)
        seq = os.getpid() & 0xFFFF
        msg_type = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE
        body = _NFGENMSG.pack(socket.AF_UNSPEC, NFNETLINK_V0, 0)
        header = _NLMSGHDR.pack(
            _NLMSGHDR.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
        )
        sock.sendto(header + body, (0, 0))
        families: list[int] = []
        while True:
            data = sock.recv(_RECV_SIZE)
            offset = 0
            while offset + _NLMSGHDR.size <= len(data):
                length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
                if length < _NLMSGHDR.size:
                    return families  # malformed: stop rather than loop forever
                if kind == NLMSG_DONE:
                    return families
                if kind == NLMSG_ERROR:
                    code = -_NLMSG_ERRNO.unpack_from(data, offset + _NLMSGHDR.size)[0]
                    if code in (0, errno.EOPNOTSUPP, errno.ENOENT, errno.EPROTONOSUPPORT):
                        return families
                    raise OSError(code, f"nf_tables table dump: {os.strerror(code)}")
                families.append(_NFGENMSG.unpack_from(data, offset + _NLMSGHDR.size)[0])
                offset += (length + 3) & ~3  # NLMSG_ALIGN
