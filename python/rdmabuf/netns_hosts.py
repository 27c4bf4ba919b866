#!/usr/bin/env python3
"""Hosts of their own on one machine: each a set of network, PID, UTS and
mount namespaces with its own address, host name and /proc, joined by
virtual links to one switch, so that processes on two of them see each other
as rdmabuf sees processes on two machines (no same-host memory transport
between them: tcp, or ibverbs where a NIC is shared). Needs root (or
CAP_SYS_ADMIN and CAP_NET_ADMIN), iproute2 and util-linux.

    python3 -m rdmabuf.netns_hosts run [--count N] -- COMMAND...
        # make N hosts, run COMMAND, remove them
    scripts/netns_hosts.py exec HOST -- COMMAND...  # inside COMMAND: run on host HOST
    scripts/netns_hosts.py ssh HOST WORDS...        # as ssh: WORDS joined, run by sh

(scripts/netns_hosts.py is this file, which imports nothing of rdmabuf.)

`run` runs COMMAND in this machine's namespaces with RDMABUF_NETNS_HOSTS
set (the hosts, for `exec` and for hosts_from_environment()); the hosts are
h0, h1, ... at 198.18.0.1, 198.18.0.2, ... (the benchmarking range,
198.18.0.0/15: the switch is a namespace of its own, so nothing of it is
routed anywhere else). Each host's /etc/hosts names them all, as a
cluster's DNS would. From Python:

    with Hosts(2) as hosts:
        hosts[1].popen(["rdmabuf", "serve"])
        hosts[0].run(["rdmabuf", "read", handle])
        hosts[1].remove()                          # as if the machine died

The hosts go away when `run` ends or the `with` block is left, and with
the process that made them if it dies (their holders are its children,
killed on its death).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import shlex
import socket
import struct
import threading
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

SUBNET = "198.18.0"  # /24, inside 198.18.0.0/15
ENV_NAME = "RDMABUF_NETNS_HOSTS"
# Inside a host its /proc shows its own PID namespace only; the machine's
# /proc is bound here (under the state directory). A process may enter only
# the PID namespaces below its own, so a command on one host starts one on
# another (as ssh would) by asking the process that made the hosts, over
# LAUNCHER (a Unix socket in the state directory: those reach across
# network namespaces).
ROOT_PROC = "root-proc"
LAUNCHER = "launch.sock"
_PR_SET_PDEATHSIG = 1


def can_make_hosts() -> bool:
    """Whether this process may make namespaces (root, or CAP_SYS_ADMIN)."""
    done = subprocess.run(["unshare", "--net", "true"], capture_output=True)
    return done.returncode == 0


def die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the process that made it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _check(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"netns_hosts: {' '.join(argv)} failed: {done.stdout.strip()}")


def _holder_pid(unshare: subprocess.Popen) -> int:
    """The PID (in this namespace) of the process `unshare --fork` started:
    PID 1 of the new PID namespace, whose namespaces the host is."""
    children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children")
    for _ in range(500):
        words = children.read_text().split() if children.exists() else []
        if words:
            return int(words[0])
        if unshare.poll() is not None:
            raise RuntimeError(f"netns_hosts: unshare exited ({unshare.returncode})")
        time.sleep(0.01)
    raise RuntimeError("netns_hosts: unshare started no process")


class Host:
    """One host: `name` (its host name), `address` (its IPv4 address), and
    `pid`, PID 1 of its PID namespace as this machine's /proc numbers it."""

    def __init__(self, name: str, address: str, pid: int, state_dir: str) -> None:
        self.name = name
        self.address = address
        self.pid = pid
        self.state_dir = state_dir
        self._holder: Optional[subprocess.Popen] = None

    def command(self, argv: Sequence[str], cwd: Optional[str] = None) -> List[str]:
        """`argv` as a command line that runs it on this host, from this
        machine's namespaces: nsenter into the host's namespaces, then argv
        in `cwd` (default: the current directory). From a host, use
        launch()."""
        ns = Path("/proc") / str(self.pid) / "ns"
        # nsenter forks to enter the PID namespace; its child dies with it
        # (setpriv --pdeathsig), so that killing the command line kills argv.
        return [
            "nsenter", f"--net={ns}/net", f"--uts={ns}/uts", f"--mount={ns}/mnt",
            f"--pid={ns}/pid", f"--wd={cwd or os.getcwd()}", "--",
            "setpriv", "--pdeathsig", "KILL", "--", *argv,
        ]  # fmt: skip

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Starts argv on this host (subprocess.Popen's keyword arguments)."""
        return subprocess.Popen(self.command(argv, kwargs.pop("cwd", None)), **kwargs)

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """Runs argv on this host to the end (subprocess.run's keyword arguments)."""
        return subprocess.run(self.command(argv, kwargs.pop("cwd", None)), **kwargs)

    def launch(self, argv: Sequence[str]) -> int:
        """Runs argv on this host from anywhere (this machine or a host),
        with this process's standard streams, directory and environment,
        and returns its exit status; as ssh would. The command is killed
        when this process dies."""
        if _in_root_pid_namespace(self.state_dir):
            return subprocess.run(self.command(argv)).returncode
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(Path(self.state_dir) / LAUNCHER))
            request = {"host": self.name, "argv": list(argv), "cwd": os.getcwd(),
                       "env": dict(os.environ)}  # fmt: skip
            socket.send_fds(s, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
            status = s.recv(4)
        if len(status) != 4:
            raise RuntimeError(f"netns_hosts: the launcher did not report {argv[0]}'s exit")
        return struct.unpack("<i", status)[0]

    def cut(self) -> None:
        """Unplugs this host: its link goes, its processes stay (they hear
        nothing more from the others, and the others nothing from them:
        no reset, no FIN). Idempotent."""
        subprocess.run(
            self._switch_command(["ip", "link", "del", self.name]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def remove(self) -> None:
        """The machine dies: unplugged first (nothing it sends gets out),
        then every process on it killed. Idempotent."""
        self.cut()
        if self._holder is not None and self._holder.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)  # PID 1: the kernel kills the rest
            except ProcessLookupError:
                pass
            self._holder.kill()
            self._holder.wait()

    def _switch_command(self, argv: Sequence[str]) -> List[str]:
        switch_pid = Path(self.state_dir, "switch.pid").read_text().strip()
        return ["nsenter", f"--net=/proc/{switch_pid}/ns/net", "--", *argv]

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.address})"


class Hosts:
    """`count` hosts, h0.. at 198.18.0.1..; a context manager (up on entry,
    removed on exit). Indexable and iterable."""

    def __init__(self, count: int = 2) -> None:
        if not 1 <= count <= 250:
            raise ValueError("netns_hosts: 1 to 250 hosts")
        self.count = count
        self.hosts: List[Host] = []
        self.state_dir = ""
        self._switch: Optional[subprocess.Popen] = None
        self._launcher: Optional[socket.socket] = None
        self._restore_sigterm = False

    def __enter__(self) -> "Hosts":
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def environment(self) -> Dict[str, str]:
        """RDMABUF_NETNS_HOSTS for a command that should find these hosts."""
        spec = ",".join(f"{h.name}={h.address}@{h.pid}" for h in self.hosts)
        return {ENV_NAME: f"{self.state_dir};{spec}"}

    def up(self) -> None:
        # SIGTERM ends this process through its `finally` blocks and `with`
        # exits (Python's default would skip them and leave the state
        # directory behind; the namespaces die with their holders anyway).
        if threading.current_thread() is threading.main_thread() and (
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        ):
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
            self._restore_sigterm = True
        missing = [t for t in ("ip", "nsenter", "unshare", "mount", "setpriv") if not shutil.which(t)]
        if missing:
            raise RuntimeError(f"netns_hosts: needs {', '.join(missing)} (iproute2, util-linux)")
        self.state_dir = tempfile.mkdtemp(prefix="rdmabuf-hosts-")
        os.mkdir(Path(self.state_dir, ROOT_PROC))
        Path(self.state_dir, "root-pidns").write_text(os.readlink("/proc/self/ns/pid") + "\n")
        try:
            self._make()
        except BaseException:
            self.down()
            raise

    def _make(self) -> None:
        state = Path(self.state_dir)
        self._switch = subprocess.Popen(
            ["unshare", "--net", "--fork", "--kill-child", "sleep", "infinity"],
            preexec_fn=die_with_parent,
        )  # fmt: skip
        switch_pid = _holder_pid(self._switch)
        state.joinpath("switch.pid").write_text(f"{switch_pid}\n")
        in_switch = ["nsenter", f"--net=/proc/{switch_pid}/ns/net", "--"]
        _check([*in_switch, "ip", "link", "add", "switch", "type", "bridge"])
        _check([*in_switch, "ip", "link", "set", "switch", "up"])
        names = [f"h{i}" for i in range(self.count)]
        addresses = [f"{SUBNET}.{i + 1}" for i in range(self.count)]
        etc_hosts = state / "hosts"
        etc_hosts.write_text(
            "127.0.0.1\tlocalhost\n" + "".join(f"{a}\t{n}\n" for n, a in zip(names, addresses))
        )
        for name, address in zip(names, addresses):
            # The host's /proc is its own PID namespace's; the machine's stays
            # reachable at ROOT_PROC, and /etc/hosts names every host.
            setup = (
                f"mount --bind /proc {shlex.quote(str(state / ROOT_PROC))} && "
                f"mount -t proc proc /proc && mount --bind {shlex.quote(str(etc_hosts))} "
                f"/etc/hosts && hostname {name} && exec sleep infinity"
            )
            holder = subprocess.Popen(
                ["unshare", "--net", "--pid", "--uts", "--mount", "--propagation", "private",
                 "--fork", "--kill-child", "sh", "-c", setup],
                preexec_fn=die_with_parent,
            )  # fmt: skip
            host = Host(name, address, _holder_pid(holder), self.state_dir)
            host._holder = holder
            self.hosts.append(host)
            _check(["ip", "link", "add", name, "netns", str(switch_pid), "type", "veth",
                    "peer", "name", "eth0", "netns", str(host.pid)])  # fmt: skip
            _check([*in_switch, "ip", "link", "set", name, "master", "switch", "up"])
            in_host = ["nsenter", f"--net=/proc/{host.pid}/ns/net", "--"]
            _check([*in_host, "ip", "link", "set", "lo", "up"])
            _check([*in_host, "ip", "addr", "add", f"{address}/24", "dev", "eth0"])
            _check([*in_host, "ip", "link", "set", "eth0", "up"])
        self._launcher = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._launcher.bind(str(state / LAUNCHER))
        os.chmod(state / LAUNCHER, 0o600)  # root's only, as the state directory
        self._launcher.listen(64)
        threading.Thread(
            target=_serve_launches, args=(self._launcher, {h.name: h for h in self.hosts}),
            daemon=True,
        ).start()  # fmt: skip
        for host in self.hosts:  # wait for each host's setup (its host name)
            for _ in range(500):
                if host.run(["hostname"], capture_output=True, text=True).stdout.strip() == host.name:
                    break
                time.sleep(0.01)
            else:
                raise RuntimeError(f"netns_hosts: host {host.name} did not come up")

    def down(self) -> None:
        if self._launcher is not None:
            try:
                self._launcher.shutdown(socket.SHUT_RDWR)  # wakes its accept()
            except OSError:
                pass
            self._launcher.close()
            self._launcher = None
        if self._restore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._restore_sigterm = False
        for host in self.hosts:
            host.remove()
        if self._switch is not None:
            self._switch.kill()
            self._switch.wait()
        self.hosts = []
        if self.state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)


def _in_root_pid_namespace(state_dir: str) -> bool:
    mine = os.readlink("/proc/self/ns/pid")
    return Path(state_dir, "root-pidns").read_text().strip() == mine


def _serve_launches(listener: socket.socket, hosts: Dict[str, Host]) -> None:
    """The launcher: one command per connection (Host.launch), on the
    host it names, with the caller's streams; its exit status is the
    reply. A caller that goes away takes its command with it."""

    def one(conn: socket.socket) -> None:
        fds: List[int] = []
        proc = None
        with conn:
            # Only this user's processes (the socket's mode says so too,
            # but only once chmod ran after bind).
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
            if uid != os.getuid():
                return
            try:
                # The request is one line; the caller's streams come with
                # its first bytes.
                message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
                while not message.endswith(b"\n"):
                    more = conn.recv(1 << 16)
                    if not more:
                        raise RuntimeError("the caller hung up mid-request")
                    message += more
                request = json.loads(message)
                host = hosts[request["host"]]
                proc = subprocess.Popen(
                    host.command(request["argv"], request["cwd"]), env=request["env"],
                    stdin=fds[0], stdout=fds[1], stderr=fds[2],
                )  # fmt: skip
                while proc.poll() is None:
                    readable, _, _ = select.select([conn], [], [], 0.2)
                    if readable and conn.recv(1) == b"":
                        proc.kill()  # the caller hung up: nsenter's child dies with it
                        proc.wait()
                conn.sendall(struct.pack("<i", proc.returncode))
            except Exception as e:  # noqa: BLE001 -- told to the caller's stderr
                if proc is not None:
                    proc.kill()
                if len(fds) == 3:
                    os.write(fds[2], f"netns_hosts: launch failed: {e}\n".encode())
            finally:
                for fd in fds:
                    os.close(fd)

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # closed: the hosts are gone
        threading.Thread(target=one, args=(conn,), daemon=True).start()


def hosts_from_environment() -> List[Host]:
    """The hosts a `run` command was given (RDMABUF_NETNS_HOSTS), from this
    machine's namespaces or from inside any of them."""
    value = os.environ.get(ENV_NAME, "")
    if ";" not in value:
        raise RuntimeError(f"netns_hosts: {ENV_NAME} is not set (run under `netns_hosts.py run`)")
    state_dir, spec = value.split(";", 1)
    hosts = []
    for item in spec.split(","):
        name, rest = item.split("=", 1)
        address, pid = rest.split("@", 1)
        hosts.append(Host(name, address, int(pid), state_dir))
    return hosts


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="make hosts, run a command, remove them")
    run.add_argument("--count", type=int, default=2, help="hosts to make (default 2)")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    enter = sub.add_parser("exec", help="run a command on one host (under `run`)")
    enter.add_argument("host")
    enter.add_argument("argv", nargs=argparse.REMAINDER)
    # mpirun's launch agent (plm_rsh_agent): it passes a command line for a
    # remote shell, as to ssh.
    ssh = sub.add_parser("ssh", help="as ssh HOST WORDS: run WORDS, joined, with sh -c")
    ssh.add_argument("host")
    ssh.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        parser.error("no command")
    if args.what in ("exec", "ssh"):
        hosts = {h.name: h for h in hosts_from_environment()}
        if args.host not in hosts:
            parser.error(f"no host {args.host!r} (there are {', '.join(hosts)})")
        if args.what == "ssh":
            command = ["sh", "-c", " ".join(command)]
        return hosts[args.host].launch(command)
    with Hosts(args.count) as hosts:
        return subprocess.run(command, env={**os.environ, **hosts.environment()}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
