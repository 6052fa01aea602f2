"""Target `ssh`: a systemd unit on a host reached over SSH (asyncssh).

The systemd logic is SystemdTarget's; this file adds only a runner that executes argv lists
over one SSH connection, reused for the whole trial and reopened once when it drops.

Host keys are checked strictly against a known_hosts file (default ~/.ssh/known_hosts): an
unknown host is refused unless accept_new_host_key=True (then its key is appended), and a
changed key is always refused. Client keys, ssh-agent, ~/.ssh/config (Host aliases, User,
Port, IdentityFile, ProxyJump) work as asyncssh's defaults make them.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import warnings
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.utils import CryptographyDeprecationWarning

from flagtrial.errors import TargetError
from flagtrial.targets.runner import Completed, ConnectionDropped, Held
from flagtrial.targets.systemd import SystemdTarget

with warnings.catch_warnings():
    # cryptography deprecates DSA, which asyncssh still supports: its import warns, in words
    # meant for asyncssh's authors, on the stderr of every command that reaches a host.
    warnings.simplefilter("ignore", CryptographyDeprecationWarning)
    import asyncssh

DEFAULT_PORT = 22
KEEPALIVE_S = 15.0

# The connection broke under a running command (or was found closed when used).
_DROPPED = (
    asyncssh.ConnectionLost,
    asyncssh.DisconnectError,
    asyncssh.ChannelOpenError,
    ConnectionError,
)


def command_line(argv: list[str]) -> str:
    """The line the remote login shell runs: every word quoted, so none is ever interpreted."""
    return shlex.join(argv)


def _returncode(result: asyncssh.SSHCompletedProcess) -> int:
    code = result.returncode
    if code is None:  # no exit status at all: the channel closed without one
        return 255
    return 128 - code if code < 0 else code  # killed by a signal: the shell's 128+N


class _HostKeyCheck(asyncssh.SSHClient):
    """asyncssh asks this only about a key that known_hosts does not trust."""

    def __init__(self, known_hosts: Path, accept_new: bool) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.offered: asyncssh.SSHKey | None = None
        self.host_was_known = False

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        self.offered = key
        self.host_was_known = host_is_known(self.known_hosts, host, addr, port)
        if self.host_was_known or not self.accept_new:
            return False
        append_known_host(self.known_hosts, host, port, key)
        return True


def _host_pattern(host: str, port: int) -> str:
    return host if port == DEFAULT_PORT else f"[{host}]:{port}"


def host_is_known(known_hosts: Path, host: str, addr: str, port: int) -> bool:
    """Whether known_hosts lists any key (or CA) for the host: an untrusted key is then a change."""
    if not known_hosts.exists():
        return False
    trusted, cas, *_ = asyncssh.match_known_hosts(
        str(known_hosts), host, addr, None if port == DEFAULT_PORT else port
    )
    return bool(trusted or cas)


def append_known_host(known_hosts: Path, host: str, port: int, key: asyncssh.SSHKey) -> None:
    known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    old = known_hosts.read_bytes() if known_hosts.exists() else b""
    sep = b"\n" if old and not old.endswith(b"\n") else b""
    line = _host_pattern(host, port).encode() + b" " + key.export_public_key("openssh")
    with open(known_hosts, "ab") as f:
        f.write(sep + line.rstrip(b"\n") + b"\n")


class _SshHeld:
    def __init__(self, proc: asyncssh.SSHClientProcess[str]) -> None:
        self.proc = proc

    async def readline(self) -> str:
        return (await self.proc.stdout.readline()).strip()

    def alive(self) -> bool:
        return not self.proc.is_closing()

    async def wait(self) -> int:
        result = await self.proc.wait(check=False)
        return _returncode(result)

    async def release(self) -> None:
        self.proc.stdin.write_eof()
        try:
            async with asyncio.timeout(5.0):
                await self.proc.wait_closed()
        except TimeoutError:
            self.proc.close()


class SshRunner:
    """Runs argv lists on one host over a single, lazily opened SSH connection."""

    local = False

    def __init__(
        self,
        host: str,
        port: int | None = None,
        user: str | None = None,
        *,
        known_hosts: Path | None = None,
        accept_new_host_key: bool = False,
        client_keys: Sequence[Path] | None = None,
        ssh_config: Sequence[Path] | None = None,
        proxy_jump: str | None = None,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port
        self.user = user
        self.known_hosts = known_hosts or Path.home() / ".ssh" / "known_hosts"
        self.accept_new_host_key = accept_new_host_key
        self.client_keys = client_keys
        self.ssh_config = ssh_config
        self.proxy_jump = proxy_jump
        self.connect_timeout_s = connect_timeout_s
        user_part = f"{user}@" if user else ""
        host_part = f"[{host}]" if ":" in host else host  # an IPv6 address
        self.where = f"{user_part}{host_part}" + (f":{port}" if port else "")
        self._conn: asyncssh.SSHClientConnection | None = None
        self._connecting = asyncio.Lock()

    async def _connect(self) -> asyncssh.SSHClientConnection:
        check = _HostKeyCheck(self.known_hosts, self.accept_new_host_key)
        options: dict[str, object] = {
            # A missing file means no trusted keys (strict), not "checking off".
            "known_hosts": str(self.known_hosts) if self.known_hosts.exists() else b"",
            "client_factory": lambda: check,
            "connect_timeout": self.connect_timeout_s,
            # Notice a dead peer, so a lock held through this connection is known to be lost.
            "keepalive_interval": KEEPALIVE_S,
            "keepalive_count_max": 3,
        }
        if self.port:
            options["port"] = self.port
        if self.user:
            options["username"] = self.user
        if self.client_keys is not None:
            options["client_keys"] = [str(p) for p in self.client_keys]
        if self.ssh_config is not None:
            options["config"] = [str(p) for p in self.ssh_config]
        if self.proxy_jump:
            options["tunnel"] = self.proxy_jump
        try:
            return await asyncssh.connect(self.host, **options)
        except asyncssh.HostKeyNotVerifiable as e:
            raise self._host_key_error(check, e) from None
        except asyncssh.PermissionDenied as e:
            raise TargetError(f"ssh {self.where}: permission denied ({e.reason})") from None
        except TimeoutError:
            raise TargetError(
                f"ssh {self.where}: no answer within {self.connect_timeout_s:g}s"
            ) from None
        except OSError as e:
            # asyncio words a refusal "Connect call failed (addr)": name the errno instead.
            why = os.strerror(e.errno) if e.errno and e.errno > 0 else (e.strerror or str(e))
            raise TargetError(f"ssh {self.where}: cannot connect: {why}") from None
        except asyncssh.Error as e:
            raise TargetError(f"ssh {self.where}: {e.reason}") from None

    def _host_key_error(
        self, check: _HostKeyCheck, e: asyncssh.HostKeyNotVerifiable
    ) -> TargetError:
        if check.offered is None:  # revoked, or a certificate that failed
            return TargetError(f"ssh {self.where}: host key not accepted: {e.reason}")
        fingerprint = check.offered.get_fingerprint()
        if check.host_was_known:
            return TargetError(
                f"host key for {self.where} changed (it offers {fingerprint}, which "
                f"{self.known_hosts} does not list for it); refusing to connect"
            )
        return TargetError(
            f"host {self.where} is unknown: no key for it in {self.known_hosts} (it offers "
            f"{fingerprint}); add its key there or allow accept_new_host_key to trust it"
        )

    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._connecting:
            if self._conn is None or self._conn.is_closed():
                self._conn = await self._connect()
            return self._conn

    def _dropped(self, conn: asyncssh.SSHClientConnection, e: Exception) -> ConnectionDropped:
        if self._conn is conn:
            self._conn = None
        conn.abort()
        return ConnectionDropped(f"ssh {self.where}: connection lost ({e})")

    async def exec(
        self,
        argv: list[str],
        *,
        input: bytes | None = None,
        timeout_s: float = 30.0,
        merge_stderr: bool = False,
    ) -> Completed:
        conn = await self._connection()
        try:
            result = await conn.run(
                command_line(argv),
                # No input: stdin at EOF at once, so a command that reads it cannot hang.
                stdin=asyncssh.PIPE if input else asyncssh.DEVNULL,
                input=input or None,
                encoding=None,
                check=False,
                timeout=timeout_s,
                stderr=asyncssh.STDOUT if merge_stderr else asyncssh.PIPE,
            )
        except asyncssh.TimeoutError:
            return Completed(124, b"", f"{argv[0]}: timed out after {timeout_s:g}s".encode())
        except _DROPPED as e:
            raise self._dropped(conn, e) from e
        if result.exit_status is None and result.exit_signal is None:
            # sshd always reports how a command ended: a channel closed without it is a
            # session that died (its connection or its sshd process).
            raise self._dropped(conn, ConnectionError("the session ended without an exit status"))
        out, err = result.stdout or b"", result.stderr or b""
        assert isinstance(out, bytes) and isinstance(err, bytes)
        return Completed(_returncode(result), out, err)

    async def hold(self, argv: list[str]) -> Held:
        conn = await self._connection()
        try:
            proc = await conn.create_process(command_line(argv), stderr=asyncssh.DEVNULL)
        except _DROPPED as e:
            raise self._dropped(conn, e) from e
        return _SshHeld(proc)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()


class SshTarget(SystemdTarget):
    """A systemd unit on `url` (`ssh://[user@]host[:port]`; host may be an ssh_config alias).

    Name: `ssh://user@host:port/UNIT` (plus `:SPEC_PATH` when a spec path is given).
    """

    def __init__(
        self,
        url: str,
        unit: str,
        spec_path: str | None = None,
        *,
        known_hosts: Path | None = None,
        accept_new_host_key: bool = False,
        client_keys: Sequence[Path] | None = None,
        ssh_config: Sequence[Path] | None = None,
        proxy_jump: str | None = None,
        connect_timeout_s: float = 10.0,
        restart_timeout_s: float = 120.0,
    ) -> None:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError as e:
            raise TargetError(f"invalid ssh URL {url!r}: {e}") from None
        if parts.scheme != "ssh" or not parts.hostname or parts.path.strip("/") or parts.query:
            raise TargetError(f"invalid ssh URL {url!r}: expected ssh://[user@]host[:port]")
        runner = SshRunner(
            parts.hostname,
            port,
            parts.username,
            known_hosts=known_hosts,
            accept_new_host_key=accept_new_host_key,
            client_keys=client_keys,
            ssh_config=ssh_config,
            proxy_jump=proxy_jump,
            connect_timeout_s=connect_timeout_s,
        )
        super().__init__(unit, spec_path, runner=runner, restart_timeout_s=restart_timeout_s)
        self._name_prefix = f"ssh://{runner.where}/"
