"""Answers every TCP connection and UDP datagram on PORT with NAME (tests' service member);
a TCP client that goes on sending gets its bytes echoed until it closes.

usage: serve_name.py NAME PORT; prints "ready" once listening.
"""
import socket
import sys
import threading

name, port = sys.argv[1].encode(), int(sys.argv[2])


def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", port))
    while True:
        _, peer = u.recvfrom(100)
        u.sendto(name, peer)


def answer(c):
    with c:
        c.sendall(name)
        while data := c.recv(100):
            c.sendall(data)


threading.Thread(target=udp, daemon=True).start()
t = socket.socket()
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("0.0.0.0", port))
t.listen(64)
print("ready", flush=True)
while True:
    c, _ = t.accept()
    threading.Thread(target=answer, args=(c,), daemon=True).start()
