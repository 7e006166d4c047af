"""Step kinds by name; a playbook's `steps:` list refers to them."""

from __future__ import annotations

from deployer.steps.base import Step
from deployer.steps.canary import Canary
from deployer.steps.compile import LocalCompile, RemoteCompile
from deployer.steps.git import Commit, DiffBounds
from deployer.steps.load import Storm
from deployer.steps.metrics import Baseline, Drain
from deployer.steps.services.co_restart import CoRestart
from deployer.steps.upload import Upload

KINDS: dict[str, type[Step]] = {cls.kind: cls for cls in (
    LocalCompile, Upload, RemoteCompile, DiffBounds, Commit, CoRestart, Baseline, Storm, Drain, Canary,
)}
