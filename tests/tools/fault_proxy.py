#!/usr/bin/env python3
"""fault_proxy.py: a TCP proxy between a client and Postgres that misbehaves on demand.

Usage:
    fault_proxy.py --upstream HOST:PORT [--listen-port N] [--max-lifetime SECONDS]

It listens on 127.0.0.1 only (port N, default 0: any free port) and forwards
every connection to HOST:PORT. Its first line on stdout says where it is:

    listening 127.0.0.1:<proxy port> control 127.0.0.1:<control port>

Send a mode, one line, to the control port; the reply "ok <mode>" comes once
it is in force (for every connection, old and new):

    pass        forward both ways (the start mode)
    delay MS    sleep MS milliseconds before forwarding each chunk
    reset       close every connection with a TCP RST (SO_LINGER 0); new ones too
    freeze      keep the connections open but read and forward nothing: the
                kernel still ACKs what the client sends, until its buffers fill,
                so the client sees a peer that is alive but never answers
    delay-sync MS
                forward both ways, but hold back the Sync of a client chunk
                that is one Parse and its Sync (libpq's PQsendPrepare) for MS
                milliseconds after the Parse: the server stores the statement,
                then its statement_timeout can fire while it waits for the Sync
    drop-after-listen
                forward both ways, but once a client has sent a LISTEN (and had
                its answer), close that connection (RST) when the client sends
                anything more, unforwarded; then back to pass (one connection only)
    mode        change nothing; the reply names the mode in force ("ok pass"
                once a drop-after-listen has dropped its connection)
    accepted    change nothing; the reply is "ok N": how many client
                connections it has accepted so far (each one a server
                process started, unless the mode was reset)

    e.g.  python3 -c 'import socket; s=socket.create_connection(("127.0.0.1", CPORT)); \\
          s.sendall(b"freeze\\n"); print(s.recv(64))'

It exits by itself after --max-lifetime seconds (default 120), so a test that
dies cannot leave it behind. Python 3 standard library only.
"""
import argparse
import socket
import struct
import sys
import threading
import time

CHUNK = 65536
TICK = 0.02  # how often a pump looks at the mode while it waits


class Mode:
    """The current mode, shared by every pump; a change is seen within one TICK."""

    def __init__(self):
        self._lock = threading.Lock()
        self._name = "pass"
        self._delay_ms = 0

    def set(self, name, delay_ms=0):
        with self._lock:
            self._name, self._delay_ms = name, delay_ms

    def get(self):
        with self._lock:
            return self._name, self._delay_ms

    def take(self, name):
        """True (and back to pass) if the mode is `name`: a one-shot fault fires once."""
        with self._lock:
            if self._name != name:
                return False
            self._name, self._delay_ms = "pass", 0
            return True


SYNC = b"S\x00\x00\x00\x04"


def is_parse_and_sync(data):
    """A chunk that is exactly one Parse message and a Sync (a named statement being prepared)."""
    if len(data) < 5 + len(SYNC) or data[:1] != b"P" or not data.endswith(SYNC):
        return False
    (length,) = struct.unpack("!I", data[1:5])
    return 1 + length + len(SYNC) == len(data)


def reset_close(sock):
    """Close with RST instead of FIN: linger on, timeout 0."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class Pair:
    """One client connection and its upstream connection, pumped both ways."""

    def __init__(self, client, upstream, mode):
        self.client, self.upstream, self.mode = client, upstream, mode
        self.closed = threading.Event()
        self.listened = False  # the client sent a LISTEN (drop-after-listen)
        for sock in (client, upstream):
            sock.settimeout(TICK)
            # Forward each chunk at once, as libpq and the server send theirs:
            # with Nagle on, a chunk that follows an unacknowledged one waits
            # for the peer's delayed ACK (~40 ms on Linux), which a real link
            # does not add (measured: a 1,000-key heartbeat batch, 88 ms).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def start(self):
        threading.Thread(target=self.pump, args=(self.client, self.upstream), daemon=True).start()
        threading.Thread(target=self.pump, args=(self.upstream, self.client), daemon=True).start()

    def close(self, reset):
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            if reset:
                reset_close(sock)
            else:
                try:
                    sock.close()
                except OSError:
                    pass

    def pump(self, source, sink):
        while not self.closed.is_set():
            name, delay_ms = self.mode.get()
            if name == "reset":
                self.close(reset=True)
                return
            if name == "freeze":
                time.sleep(TICK)  # read nothing: the kernel buffers and ACKs
                continue
            try:
                data = source.recv(CHUNK)
            except socket.timeout:
                continue
            except OSError:
                self.close(reset=False)
                return
            if not data:
                self.close(reset=False)
                return
            # A mode change while a chunk is in hand applies to it too.
            while not self.closed.is_set():
                name, delay_ms = self.mode.get()
                if name == "freeze":
                    time.sleep(TICK)
                    continue
                break
            if name == "reset":
                self.close(reset=True)
                return
            if source is self.client and name == "drop-after-listen":
                # The LISTEN went through and was answered; what follows it
                # (the waiter's read of the row) never reaches the server.
                if self.listened and self.mode.take("drop-after-listen"):
                    self.close(reset=True)
                    return
                if b"LISTEN " in data and b"UNLISTEN" not in data:
                    self.listened = True
            if name == "delay" and delay_ms > 0:
                time.sleep(delay_ms / 1000.0)
            if source is self.client and name == "delay-sync" and is_parse_and_sync(data):
                try:
                    sink.sendall(data[:-len(SYNC)])
                except OSError:
                    self.close(reset=False)
                    return
                time.sleep(delay_ms / 1000.0)
                data = SYNC
            try:
                sink.sendall(data)
            except OSError:
                self.close(reset=False)
                return


def serve_proxy(listener, upstream, mode, pairs, pairs_lock, accepted):
    while True:
        client, _ = listener.accept()
        accepted[0] += 1
        if mode.get()[0] == "reset":
            reset_close(client)
            continue
        try:
            remote = socket.create_connection(upstream, timeout=5)
        except OSError:
            reset_close(client)
            continue
        pair = Pair(client, remote, mode)
        with pairs_lock:
            pairs[:] = [p for p in pairs if not p.closed.is_set()] + [pair]
        pair.start()


def serve_control(listener, mode, accepted):
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            try:
                line = conn.makefile("r").readline().strip().split()
            except OSError:
                continue
            if line and line[0] == "mode":
                conn.sendall(("ok " + mode.get()[0] + "\n").encode())
                continue
            if line and line[0] == "accepted":
                conn.sendall(("ok " + str(accepted[0]) + "\n").encode())
                continue
            if not line or line[0] not in ("pass", "delay", "delay-sync", "reset", "freeze", "drop-after-listen"):
                conn.sendall(b"error: expected pass | delay MS | delay-sync MS | reset | freeze | drop-after-listen"
                             b" | mode | accepted\n")
                continue
            delay_ms = int(line[1]) if line[0] in ("delay", "delay-sync") and len(line) > 1 else 0
            mode.set(line[0], delay_ms)
            time.sleep(2 * TICK)  # every pump has looked at the mode since
            conn.sendall(("ok " + line[0] + "\n").encode())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the server")
    parser.add_argument("--listen-port", type=int, default=0)
    parser.add_argument("--max-lifetime", type=float, default=120.0, help="seconds before it exits by itself")
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    upstream = (host, int(port))

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.listen_port))
    listener.listen(64)
    control = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    control.bind(("127.0.0.1", 0))
    control.listen(8)

    mode = Mode()
    pairs, pairs_lock = [], threading.Lock()
    accepted = [0]  # one writer (serve_proxy); the control thread reads it
    threading.Thread(target=serve_proxy, args=(listener, upstream, mode, pairs, pairs_lock, accepted),
                     daemon=True).start()
    threading.Thread(target=serve_control, args=(control, mode, accepted), daemon=True).start()
    print("listening 127.0.0.1:%d control 127.0.0.1:%d" % (listener.getsockname()[1], control.getsockname()[1]),
          flush=True)
    time.sleep(args.max_lifetime)
    return 0


if __name__ == "__main__":
    sys.exit(main())
