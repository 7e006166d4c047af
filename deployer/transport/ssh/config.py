"""~/.ssh/config as OpenSSH reads it for one host: its `Host` blocks, explicit values on top, and its ProxyJump hops."""

from __future__ import annotations

import dataclasses
import getpass
import os
from dataclasses import dataclass

from deployer.errors import ConfigError
from deployer.transport.ssh.paramiko_lean import allow_match_exec, paramiko

SSH_PORT = 22


def host_entry(hostname: str, port: int) -> str:
    """The known_hosts name OpenSSH uses: bare for port 22, `[host]:port` otherwise."""
    return hostname if port == SSH_PORT else f"[{hostname}]:{port}"


@dataclass(frozen=True)
class Endpoint:
    """One SSH hop with ~/.ssh/config applied and explicit values on top."""

    label: str  # what the user asked for, for messages
    hostname: str
    port: int
    user: str
    key_name: str  # HostKeyAlias, else hostname: what known_hosts is keyed on
    identity_files: tuple[str, ...]
    identities_only: bool
    proxy_command: str | None
    hash_known_hosts: bool

    @property
    def where(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def entry(self) -> str:
        return host_entry(self.key_name, self.port)


def load_config(path: str | None) -> paramiko.SSHConfig:
    if path is None:
        default = os.path.expanduser("~/.ssh/config")
        if not os.path.isfile(default):
            return paramiko.SSHConfig()
        path = default
    path = os.path.expanduser(path)
    try:
        with open(path) as handle:  # as paramiko's from_path would, but read once for both uses
            text = handle.read()
        allow_match_exec(text)
        return paramiko.SSHConfig.from_text(text)
    except FileNotFoundError:
        raise ConfigError(f"ssh config {path} does not exist") from None
    except (OSError, ValueError, paramiko.SSHException) as exc:
        raise ConfigError(f"cannot parse ssh config {path}: {exc}") from None


def resolve(config: paramiko.SSHConfig, address: str, *, port: int | None, user: str | None,
            identity_files: tuple[str, ...] | None) -> Endpoint:
    """address through `Host` blocks; explicit (non-None) values win over the config."""
    found = config.lookup(address)
    hostname = str(found.get("hostname", address))
    if identity_files is None:
        # OpenSSH skips configured identity files that do not exist; so do we.
        configured: object = found.get("identityfile")  # a list at runtime, despite the stub
        paths = configured if isinstance(configured, list) else [configured] if configured else []
        identity_files = tuple(p for p in (os.path.expanduser(str(f)) for f in paths) if os.path.isfile(p))
    else:
        identity_files = tuple(os.path.expanduser(f) for f in identity_files)
    proxy_command = found.get("proxycommand")
    if proxy_command is not None and (found.get("proxyjump") or str(proxy_command).lower() == "none"):
        proxy_command = None
    return Endpoint(
        label=address, hostname=hostname,
        port=port if port is not None else int(found.get("port", SSH_PORT)),
        user=user or str(found.get("user") or getpass.getuser()),
        key_name=str(found.get("hostkeyalias") or hostname),
        identity_files=identity_files,
        identities_only=str(found.get("identitiesonly", "no")).lower() == "yes",
        proxy_command=None if proxy_command is None else str(proxy_command),
        hash_known_hosts=str(found.get("hashknownhosts", "no")).lower() == "yes")


def known_hosts_file(config: paramiko.SSHConfig, address: str, explicit: str | None) -> str:
    """The inventory's known_hosts, else the config's UserKnownHostsFile (its first path), else OpenSSH's."""
    configured: object = config.lookup(address).get("userknownhostsfile")
    text = configured[0] if isinstance(configured, list) and configured else configured
    first = str(text).split()[0] if text else None
    return os.path.expanduser(explicit or first or "~/.ssh/known_hosts")


def proxy_jumps(config: paramiko.SSHConfig, address: str, *,
                fallback_identities: tuple[str, ...]) -> list[Endpoint]:
    """The ProxyJump hops for address, each resolved through the config itself.

    A hop's own ProxyJump is not followed (one level of `Host` lookups, as most bastion
    setups need). A hop with no IdentityFile of its own uses the target's key."""
    value = config.lookup(address).get("proxyjump")
    if not value or str(value).lower() == "none":
        return []
    hops: list[Endpoint] = []
    for spec in str(value).split(","):
        user, host, port = _parse_jump(spec.strip())
        hop = resolve(config, host, port=port, user=user, identity_files=None)
        if not hop.identity_files and fallback_identities:
            hop = dataclasses.replace(hop, identity_files=fallback_identities)
        hops.append(hop)
    return hops


def _parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]`, `[user@][v6addr]:port` or `ssh://[user@]host[:port]`."""
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):]
    user: str | None = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port_text = ""
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif spec.count(":") == 1:
        host, port_text = spec.split(":")
    else:
        host = spec
    if port_text and not port_text.isdigit():
        raise ConfigError(f"cannot parse the ProxyJump port in {spec!r}")
    port = int(port_text) if port_text else None
    if not host:
        raise ConfigError(f"cannot parse ProxyJump host {spec!r}")
    return user, host, port
