"""Typed models of the inventory and the playbook, and their strict loading."""

from __future__ import annotations

import os
import posixpath
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from deployer import yamlsrc
from deployer.errors import ConfigError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


MIN_SECRET = 4


class SecretValue(Strict):
    """An environment value that must never be shown: `{secret: true, value: ...}` or `value_from_env`."""

    secret: bool = True
    value: str | None = None
    value_from_env: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SecretValue:
        if (self.value is None) == (self.value_from_env is None):
            raise ValueError("give exactly one of 'value' or 'value_from_env'")
        return self

    def resolve(self) -> str:
        if self.value is not None:
            found: str | None = self.value
        else:
            assert self.value_from_env is not None
            found = os.environ.get(self.value_from_env)
            if found is None:
                raise ConfigError(f"environment variable {self.value_from_env} is not set "
                                  "(an inventory value reads it with value_from_env)")
        if len(found or "") < MIN_SECRET:
            # Masking a 1-3 character string would blank out half of every line and still leak it.
            raise ConfigError(f"a secret value ({self.value_from_env or 'value'}) is shorter than "
                              f"{MIN_SECRET} characters; it cannot be masked reliably")
        return str(found)


EnvValue = str | SecretValue
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # what a POSIX shell can export


def _argv(value: str | list[str] | None) -> list[str] | None:
    if value is None or isinstance(value, list):
        return value
    return shlex.split(value)


class Service(Strict):
    """A process on the target that the patch's code runs in."""

    start: list[str] | None = None
    stop: list[str] | None = None
    systemd: str | None = None
    health: str | None = None
    health_timeout_s: float = Field(default=60.0, gt=0)
    stop_grace_s: float = Field(default=10.0, ge=0)
    cwd: str | None = None
    env: dict[Annotated[str, StringConstraints(pattern=ENV_NAME)], EnvValue] = Field(default_factory=dict)

    _split = field_validator("start", "stop", mode="before")(_argv)

    @model_validator(mode="after")
    def _one_manager(self) -> Service:
        if (self.start is None) == (self.systemd is None):
            raise ValueError("give exactly one of 'start' (a command) or 'systemd' (a unit name)")
        if self.start is not None and not self.start:
            raise ValueError("'start' is empty")
        return self


class Host(Strict):
    transport: Literal["ssh", "local"] = "ssh"
    address: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = None  # default ~/.ssh/config; the host name (or address) may be an alias there
    host_key_policy: Literal["reject", "accept-new"] = "reject"
    repo: str
    python: str = "python3"
    metrics: str | None = None
    endpoint: str | None = None  # the serving entry point (e.g. the router) that a storm hits
    services: dict[str, Service] = Field(default_factory=dict)
    env: dict[Annotated[str, StringConstraints(pattern=ENV_NAME)], EnvValue] = Field(default_factory=dict)
    become: bool = False
    lock_ttl_s: float = Field(default=120.0, gt=0)

    @field_validator("repo")
    @classmethod
    def _absolute_repo(cls, repo: str) -> str:
        if not posixpath.isabs(repo):
            raise ValueError("must be an absolute path on the target")
        return posixpath.normpath(repo)

    def secrets(self) -> list[str]:
        envs = [self.env, *(s.env for s in self.services.values())]
        return [v.resolve() for env in envs for v in env.values() if isinstance(v, SecretValue) and v.secret]


def resolve_env(env: dict[str, EnvValue]) -> dict[str, str]:
    return {k: v.resolve() if isinstance(v, SecretValue) else v for k, v in env.items()}


class Inventory(Strict):
    hosts: dict[str, Host]


class FileSpec(Strict):
    src: str
    dest: str
    create: bool = False  # the dest may be a file git does not track yet

    @field_validator("dest")
    @classmethod
    def _inside_repo(cls, dest: str) -> str:
        return check_repo_relative(dest)


def check_repo_relative(dest: str) -> str:
    """A path relative to the repo that cannot leave it or touch git's own files."""
    if not dest or posixpath.isabs(dest):
        raise ValueError("must be a path relative to the host's repo, not absolute")
    parts = dest.split("/")
    if ".." in parts:
        raise ValueError("must not contain '..' (it would escape the repo)")
    if ".git" in parts:
        raise ValueError("must not point into .git")
    if dest.startswith("-"):
        raise ValueError("must not start with '-'")
    if posixpath.normpath(dest) == "." or dest.endswith("/"):
        raise ValueError("must name a file, not a directory")
    return posixpath.normpath(dest)


class Playbook(Strict):
    name: str = Field(min_length=1)
    description: str = ""
    files: list[FileSpec] = Field(default_factory=list)
    patch: str | None = None
    steps: list[Any] = Field(min_length=1)
    on_failure: Literal["restore", "rollback"] = "restore"

    @model_validator(mode="after")
    def _files_or_patch(self) -> Playbook:
        if bool(self.files) == (self.patch is not None):
            raise ValueError("give exactly one of 'files' or 'patch'")
        dests = [f.dest for f in self.files]
        if len(set(dests)) != len(dests):
            raise ValueError("two files have the same dest")
        return self


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: Any, doc: yamlsrc.Document, base: yamlsrc.Loc = ()) -> M:
    """Validate data with the model; errors name file:line:column and the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, doc, base)) from None


def format_errors(exc: ValidationError, doc: yamlsrc.Document, base: yamlsrc.Loc = ()) -> str:
    lines = []
    for error in exc.errors():
        kept: list[str | int] = list(base)
        raw = error["loc"]
        for i, part in enumerate(raw):
            # Union branches add type names to the location; keep only real keys.
            candidate = (*kept, part)
            if candidate in doc.marks or (i == len(raw) - 1 and error["type"] == "missing"):
                kept.append(part)
        field = ".".join(str(p) for p in kept) or "(top level)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "value_error":
            message = str(error.get("ctx", {}).get("error", message))
        elif error["type"] == "missing":
            message = "required field is missing"
        lines.append(f"{doc.mark(tuple(kept))}: {field}: {message}")
    return "\n".join(lines)


def find_inventory(explicit: str | None) -> Path:
    chosen = explicit or os.environ.get("DEPLOYER_INVENTORY") or "hosts.yaml"
    path = Path(chosen)
    if not path.exists():
        how = ("-i/--inventory" if explicit else
               "$DEPLOYER_INVENTORY" if os.environ.get("DEPLOYER_INVENTORY") else "./hosts.yaml")
        raise ConfigError(f"inventory {path} not found (from {how}); "
                          "pass -i FILE or set DEPLOYER_INVENTORY")
    return path


def load_inventory(path: Path) -> Inventory:
    doc = yamlsrc.load(path)
    if not isinstance(doc.data, dict):
        raise ConfigError(f"{path}:1:1: an inventory is a mapping with a 'hosts' key")
    return validate(Inventory, doc.data, doc)


def get_host(inventory: Inventory, name: str, path: Path) -> Host:
    try:
        return inventory.hosts[name]
    except KeyError:
        known = ", ".join(sorted(inventory.hosts)) or "none"
        raise ConfigError(f"host {name!r} is not in {path} (hosts: {known})") from None
