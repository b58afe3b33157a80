"""Answers every TCP connection and UDP datagram on PORT with NAME (tests' service member);
a TCP client that goes on sending gets its bytes echoed until it closes. NAME `@peer`
answers with the client's address instead (what a NAT made of it).

usage: serve_name.py NAME PORT; prints "ready" once listening.
"""
import socket
import sys
import threading

name, port = sys.argv[1].encode(), int(sys.argv[2])


def reply(peer):
    return peer[0].encode() if name == b"@peer" else name


def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", port))
    while True:
        _, peer = u.recvfrom(100)
        u.sendto(reply(peer), peer)


def answer(c, peer):
    with c:
        c.sendall(reply(peer))
        while data := c.recv(100):
            c.sendall(data)


threading.Thread(target=udp, daemon=True).start()
t = socket.socket()
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("0.0.0.0", port))
t.listen(64)
print("ready", flush=True)
while True:
    c, peer = t.accept()
    threading.Thread(target=answer, args=(c, peer), daemon=True).start()
