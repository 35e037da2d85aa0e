#!/usr/bin/env python3
"""One TCP stream's throughput, for the netbed (no dependencies).

  tcprate.py serve PORT            accept one connection, read to EOF, print
                                   "bytes seconds mbit/s" (timed from the
                                   first byte received to EOF)
  tcprate.py send HOST PORT SECS   send as fast as possible for SECS seconds
  tcprate.py reach HOST [PORT [SECS]]  exit 0 if HOST answers a TCP connect
                                   to PORT (default 9) within SECS (default
                                   1), accepted or refused; 1 if not (no ping
                                   on this machine)
"""
import errno
import socket
import sys
import time


def serve(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    c, _ = s.accept()
    buf = bytearray(1 << 20)
    n = c.recv_into(buf)
    t0 = time.monotonic()
    total = 0
    while True:
        n = c.recv_into(buf)
        if n == 0:
            break
        total += n
    dt = time.monotonic() - t0
    print(f"{total} {dt:.3f} {total * 8 / dt / 1e6:.1f}", flush=True)


def send(host, port, secs):
    c = socket.create_connection((host, port), timeout=10)
    data = b"\0" * (1 << 20)
    end = time.monotonic() + secs
    while time.monotonic() < end:
        c.sendall(data)
    c.shutdown(socket.SHUT_WR)
    c.recv(1)
    c.close()


def reach(host, port, secs):
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.settimeout(secs)
    try:
        c.connect((host, port))
        return 0
    except ConnectionRefusedError:
        return 0
    except OSError as e:
        print(f"{host}:{port} unreachable: {e}", file=sys.stderr)
        return 1
    finally:
        c.close()


if __name__ == "__main__":
    if sys.argv[1] == "reach":
        a = sys.argv[2:] + ["9", "1"][len(sys.argv) - 3:]
        sys.exit(reach(a[0], int(a[1]), float(a[2])))
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        send(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
