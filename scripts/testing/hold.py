"""One TCP connection to ADDR:PORT held open: prints the first answer, then for each line
read on stdin sends it and prints what comes back (tests of connections that outlive a
restart).

usage: hold.py ADDR PORT
"""
import socket
import sys

s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
print(s.recv(100).decode(), flush=True)
for line in sys.stdin:
    s.sendall(line.strip().encode())
    print(s.recv(100).decode(), flush=True)
