#!/usr/bin/env python3
# Prints N loopback TCP ports that are free now, chosen at random below the ephemeral range
# (32768): other helpers' test servers and the clients' own ephemeral ports cannot take them
# meanwhile as easily as a fixed port or one the kernel hands out.
import random
import socket
import sys


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    # A server bound to 0.0.0.0 or ::ffff:127.0.0.1 may still hold it: try connecting too.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) != 0


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    chosen: list[int] = []
    for _ in range(10000):
        port = random.randint(20000, 32000)
        if port not in chosen and port_is_free(port):
            chosen.append(port)
            if len(chosen) == count:
                print(" ".join(map(str, chosen)))
                return
    sys.exit("free_ports: not enough free ports below 32768")


if __name__ == "__main__":
    main()
