#!/usr/bin/python3
# zk_lock.py HOSTS LOCK_PATH COMMAND [ARGS...]: the ZooKeeper peer of `pgmutex run --wait` and
# `etcdctl lock` in bench_handoff.sh: takes kazoo's Lock recipe (its default 10 s session
# timeout), runs COMMAND while holding it, releases it and exits with COMMAND's code.
# SIGTERM while waiting closes the session (so its queued node goes at once, as a cancelled
# pgmutex waiter's does); SIGKILL does not, which is what the dead-head scenario measures.
import signal
import subprocess
import sys

from kazoo.client import KazooClient


def leave(signum, frame):
    raise SystemExit(128 + signum)


def main() -> int:
    hosts, lock_path, command = sys.argv[1], sys.argv[2], sys.argv[3:]
    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    client = KazooClient(hosts=hosts)  # timeout=10.0, kazoo's default
    client.start()
    try:
        with client.Lock(lock_path):
            return subprocess.call(command)
    finally:
        client.stop()
        client.close()


if __name__ == "__main__":
    sys.exit(main())
