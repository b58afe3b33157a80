"""N connections (or UDP exchanges with `udp`) to ADDR:PORT, one after the other.

usage: connect.py ADDR PORT N [udp [SPORT]]; prints what each answered, or refused,
timeout, error. With SPORT, every UDP exchange leaves from that port: one flow, as a
client that keeps sending from one socket.
"""
import socket
import sys

addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
udp = sys.argv[4:5] == ["udp"]
sport = int(sys.argv[5]) if len(sys.argv) > 5 else None
out = []
for _ in range(n):
    try:
        if udp:
            family = socket.AF_INET6 if ":" in addr else socket.AF_INET
            s = socket.socket(family, socket.SOCK_DGRAM)
            s.settimeout(2)
            if sport is not None:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("", sport))
            s.connect((addr, port))
            s.send(b"x")
            out.append(s.recv(100).decode())
        else:
            s = socket.create_connection((addr, port), timeout=2)
            out.append(s.recv(100).decode())
        s.close()
    except ConnectionRefusedError:
        out.append("refused")
    except OSError as e:
        out.append("timeout" if "timed out" in str(e) else "error")
print(" ".join(out))
