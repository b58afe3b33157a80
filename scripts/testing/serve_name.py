"""Answers every TCP connection and UDP datagram on PORT with NAME (tests' service member),
over IPv4 and IPv6; a TCP client that goes on sending gets its bytes echoed until it
closes. NAME `@peer` answers with the client's address instead (what a NAT made of it).

usage: serve_name.py NAME PORT; prints "ready" once listening.
"""
import socket
import sys
import threading

name, port = sys.argv[1].encode(), int(sys.argv[2])


def reply(peer):
    # An IPv4 client of the dual-stack socket shows as ::ffff:a.b.c.d.
    return peer[0].removeprefix("::ffff:").encode() if name == b"@peer" else name


def bound(kind):
    """A socket of `kind` on PORT of every address of both families (IPv4 alone where
    the namespace has no IPv6)."""
    try:
        s = socket.socket(socket.AF_INET6, kind)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address = ("::", port)
    except OSError:
        s, address = socket.socket(socket.AF_INET, kind), ("0.0.0.0", port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(address)
    return s


def udp():
    u = bound(socket.SOCK_DGRAM)
    while True:
        _, peer = u.recvfrom(100)
        u.sendto(reply(peer), peer)


def answer(c, peer):
    with c:
        c.sendall(reply(peer))
        while data := c.recv(100):
            c.sendall(data)


threading.Thread(target=udp, daemon=True).start()
t = bound(socket.SOCK_STREAM)
t.listen(64)
print("ready", flush=True)
while True:
    c, peer = t.accept()
    threading.Thread(target=answer, args=(c, peer), daemon=True).start()
