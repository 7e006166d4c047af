"""A playbook's `rollout:`: how a fleet run spreads over its hosts (batch sizes, or a rolling strategy's
max_unavailable), how many failures stop it, and where it pauses (Argo Rollouts' canary `steps`: a pause for a
person's approval or for a while between batches, and an inconclusive analysis held for a person)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    model_validator,
)

from deployer.config.validation import did_you_mean
from deployer.errors import ConfigError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # config.models.Strict's (it imports this)


def check_batch(size: int | str) -> int | str:
    return check_share(size, "host")


def check_unavailable(size: int | str) -> int | str:
    return check_share(size, "unit")


def check_share(size: int | str, of: str) -> int | str:
    """A count of hosts or units (at least 1), or a percentage of them such as '25%'."""
    if isinstance(size, int):
        if size < 1:
            raise ValueError(f"must be at least 1 {of}")
        return size
    number = size[:-1] if size.endswith("%") else None
    try:
        percent = float(number) if number is not None else None
    except ValueError:
        percent = None
    if percent is None:
        raise ValueError(f"{size!r}: must be a {of} count or a percentage such as '25%'")
    if not 0 < percent <= 100:
        raise ValueError(f"{size!r}: a percentage must be above 0% and at most 100%")
    return size


def share_of(size: int | str, total: int) -> int:
    """A count, or a percentage of total rounded up; at least 1."""
    return max(1, size if isinstance(size, int) else int(-(-total * float(size[:-1]) // 100)))


def _all_at_once() -> list[int | str]:
    return ["100%"]


_UNITS = {"s": 1, "m": 60, "h": 3600}


def seconds_of(value: object) -> object:
    """Argo's durations: a number of seconds, or a string such as '30s', '10m', '1h'."""
    if not isinstance(value, str):
        return value
    if found := re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", value):
        return float(found[1]) * _UNITS[found[2] or "s"]
    raise ValueError(f"{value!r}: a duration is a number of seconds, or a number and s, m or h: 30s, 10m, 1h")


class PauseSpec(Strict):
    duration: Annotated[float, BeforeValidator(seconds_of)] | None = Field(default=None, gt=0, description=(
        "How long to wait before the next batch starts (seconds, or '30s', '10m', '1h'). Left out: the fleet run "
        "stops here, recorded as paused (exit 8), until `deployer rollout resume FLEET_ID` (or `abort`)."))


class Pause(Strict):
    pause: PauseSpec = Field(description="A pause between two batches: for a while, or until a person resumes.")


SHAPES = "a step is `batch` or `pause: {}` (until resumed) or `pause: {duration: 10m}`"


def step_shape(value: Any) -> Any:
    """A step that is neither `batch` nor `{pause: ...}`, in the words of what was meant (did you mean, how a pause
    is written), rather than a union's 'must be batch' beside whatever the pause said."""
    if isinstance(value, str) and value != "batch":
        if value == "pause":
            raise ValueError("a pause is a mapping: write `pause: {}` (until resumed) or `pause: {duration: 10m}`")
        raise ValueError(f"unknown step {value!r}{did_you_mean(value, ['batch', 'pause'])}: {SHAPES}")
    if isinstance(value, dict) and list(value) != ["pause"]:
        guess = did_you_mean(str(next(iter(value))), ["pause"]) if len(value) == 1 else ""
        raise ValueError(f"{', '.join(map(repr, value)) or 'an empty mapping'}{guess}: {SHAPES}")
    if not isinstance(value, (str, dict)):
        raise ValueError(SHAPES)
    return value


# Tagged (the tags are no keys: locations drop them) so that a pause's problem is not said beside 'must be batch'.
Step = Annotated[Annotated[Literal["batch"], Tag("batch step")] | Annotated[Pause, Tag("pause step")],
                 Discriminator(lambda value: "batch step" if isinstance(value, str) else "pause step"),
                 BeforeValidator(step_shape)]


class Rollout(Strict):
    """How a fleet run spreads over its hosts: batches in order (the first is the canary)."""

    # Ansible's `serial`
    batches: list[Annotated[int | str, AfterValidator(check_batch)]] = Field(
        default_factory=_all_at_once, min_length=1, description=(
            "The size of each batch in order, a host count or a percentage of all hosts (rounded up); the last "
            "size repeats until every host is in a batch."))
    max_failures: int = Field(default=0, ge=0, description="More failed hosts than this, and no further batch starts.")
    pause_s: float = Field(default=0.0, ge=0, description="Seconds between batches.")
    strategy: Literal["batches", "rolling"] = Field(default="batches", description=(
        "batches (the default), or rolling: units taken out of their router around their restart, "
        "max_unavailable at a time."))
    # Kubernetes' maxUnavailable, counted in units (a plain host outside a unit is a unit of its own)
    max_unavailable: Annotated[int | str, AfterValidator(check_unavailable)] = Field(default=1, description=(
        "strategy rolling: how many units restart at once, a count or a percentage of the run's units (rounded up, "
        "at least 1); a batch never takes every worker of one role (prefill, decode) behind a router out of it."))
    # Argo Rollouts' canary steps, over the batches above
    steps: list[Step] = Field(default_factory=list, description=(
        "The rollout in order: `batch` (the next batch) and `pause: {}` (until `deployer rollout resume`) or "
        "`pause: {duration: 10m}` between them; the batches after the last step run one after the other. "
        "E.g. [batch, {pause: {}}]: a person approves after the canary batch."))
    on_inconclusive: Literal["fail", "pause"] = Field(default="fail", description=(
        "An analysis that is inconclusive on a host of a fleet run: fail (the default) counts the host as failed "
        "(exit 7); pause stops the fleet run once its batch ended, paused for a person (exit 8): resume keeps "
        "the host's commit and goes on, abort rolls back every host that committed."))

    @model_validator(mode="after")
    def _unavailable_rolls(self) -> Rollout:
        if self.max_unavailable != 1 and self.strategy != "rolling":
            raise ValueError("max_unavailable is for strategy: rolling (strategy batches takes its sizes in batches)")
        return self

    @model_validator(mode="after")
    def _pauses_between_batches(self) -> Rollout:
        for index, step in enumerate(self.steps):
            if isinstance(step, Pause) and (index == 0 or isinstance(self.steps[index - 1], Pause)):
                why = ("a pause goes after a batch (nothing has changed yet): start with `batch`" if index == 0 else
                       "a pause goes after a batch, one between two batches: put a `batch` before this pause")
                # reported at the step, not at `rollout:` (a model validator's place)
                raise ValidationError.from_exception_data("Rollout", [{
                    "type": "value_error", "loc": ("steps", index), "input": step,
                    "ctx": {"error": ValueError(why)}}])
        return self

    # Where each of `steps` is written (file:line:col), set by the playbook's loader: whether a step is ever reached
    # depends on the hosts a run takes (check_steps), so that is refused when they are known, pointing at the step.
    _where: list[str] = PrivateAttr(default_factory=list)

    def locate(self, where: list[str]) -> None:
        self._where = where

    def check_steps(self, count: int, hosts: int) -> None:
        """Refuse steps the `count` batches that `hosts` hosts make never reach: a pause after the last batch (the
        run ends there; what a user writes first, [batch, {pause: {}}] with every host in one batch), or a batch
        step past the last batch. Argo Rollouts' steps are the progression itself: none is silently skipped."""
        done = 0
        for index, step in enumerate(self.steps):
            if isinstance(step, Pause) and done < count:
                continue
            if not isinstance(step, Pause) and done < count:
                done += 1
                continue
            made = (f"the {hosts} host{'s' if hosts != 1 else ''} of this run make {count} "
                    f"batch{'es' if count != 1 else ''} ({self.sizes()})")
            why = ("this pause comes after the last batch, so it is never reached" if isinstance(step, Pause)
                   else f"this step would start batch {done + 1}")
            where = self._where[index] if index < len(self._where) else "rollout"
            raise ConfigError(f"{where}: rollout.steps.{index}: {why}: {made}; {self.more_batches(count)}")

    def sizes(self) -> str:
        return (f"max_unavailable: {self.max_unavailable!r}" if self.strategy == "rolling"
                else f"batches: {list(self.batches)!r}")

    def more_batches(self, count: int) -> str:
        """How to make the batches a rollout's steps need."""
        if self.strategy == "rolling":
            return "take fewer units at a time (a smaller max_unavailable), or drop the steps past the last batch"
        if count == 1:
            return "to pause after a canary, split the hosts: e.g. batches: [1, '100%'] (one host, then the rest)"
        return f"drop the steps past batch {count}, or give smaller batches"

    def pauses(self) -> dict[int, PauseSpec]:
        """Batch number -> the pause before it starts."""
        found, done = {}, 0
        for step in self.steps:
            if isinstance(step, Pause):
                found[done] = step.pause
            else:
                done += 1
        return found

    def split(self, hosts: list[str]) -> list[list[str]]:
        batches, start, index = [], 0, 0
        while start < len(hosts):
            end = start + share_of(self.batches[min(index, len(self.batches) - 1)], len(hosts))
            batches.append(hosts[start:end])
            start, index = end, index + 1
        return batches
