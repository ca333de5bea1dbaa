"""Two "hosts" on one machine for multi-host tests: two network namespaces joined by a veth pair,
each with its own loopback, address, hostname (UTS namespace) and /dev/shm (a private tmpfs in a
mount namespace, so shared memory cannot cross "hosts"). Everything the processes send stays in
these namespaces; on exit every process still in them is killed and the namespaces are deleted
(their veth ends go with them), also after a failure."""
import os
import secrets
import shlex
import subprocess

__all__ = ["TwoHosts", "namespaces_unavailable"]


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def namespaces_unavailable():
    """Why network namespaces cannot be made here (None when they can): tried for real."""
    name = f"mshprobe{secrets.token_hex(3)}"
    try:
        probe = _ip("netns", "add", name, check=False)
    except FileNotFoundError:
        return "the `ip` command (iproute2) is not installed"
    if probe.returncode != 0:
        return f"`ip netns add` failed: {probe.stderr.strip()} (needs root / CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    _ip("netns", "del", name, check=False)
    if subprocess.run(["unshare", "--uts", "--mount", "--ipc", "true"], capture_output=True).returncode != 0:
        return "`unshare --uts --mount --ipc` failed (needs CAP_SYS_ADMIN)"
    return None


class TwoHosts:
    """Hosts 0 and 1: namespaces <tag>a/<tag>b with addresses 10.213.<n>.1 and .2 on a veth pair."""

    def __init__(self):
        tag = secrets.token_hex(3)
        self.names = (f"msh{tag}a", f"msh{tag}b")
        self.links = (f"mh{tag}a", f"mh{tag}b")
        subnet = int(tag, 16) % 250 + 1
        self.addresses = (f"10.213.{subnet}.1", f"10.213.{subnet}.2")
        self.hostnames = ("host0", "host1")

    def __enter__(self) -> "TwoHosts":
        try:
            for name in self.names:
                _ip("netns", "add", name)
            _ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
            for name, link, address in zip(self.names, self.links, self.addresses):
                _ip("link", "set", link, "netns", name)
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
                _ip("-n", name, "link", "set", link, "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def start(self, host: int, argv, env, stdout) -> subprocess.Popen:
        """Run `argv` on `host`: in its network namespace, with its hostname and its own /dev/shm."""
        inner = (f"hostname {self.hostnames[host]} && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "
                 + " ".join(shlex.quote(str(a)) for a in argv))
        return subprocess.Popen(["ip", "netns", "exec", self.names[host], "unshare", "--uts", "--mount", "--ipc",
                                 "sh", "-c", inner], env=env, stdout=stdout, stderr=subprocess.STDOUT)

    def pids(self, host: int):
        """Every process running in `host`'s network namespace."""
        out = _ip("netns", "pids", self.names[host], check=False).stdout
        return [int(p) for p in out.split()]

    def kill(self, host: int) -> int:
        """SIGKILL every process of `host` (all of them started by this test); returns how many."""
        pids = self.pids(host)
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        return len(pids)

    def __exit__(self, *exc) -> None:
        for host in (0, 1):
            self.kill(host)
        for name in self.names:
            _ip("netns", "del", name, check=False)
        _ip("link", "del", self.links[0], check=False)  # only if it never moved into a namespace
