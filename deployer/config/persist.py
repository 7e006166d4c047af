"""A playbook's `persist:` (top level, for every dest): must what it ships into a container outlive a recreate?

`required`: every dest must be on a bind mount or a volume of the host's container; one in the container's writable
layer (kept across a restart, lost when the container is recreated) refuses the run before anything changes
(run/mounts.py). In a pod (`transport: kubernetes`) every dest must be on a hostPath or a PVC: the container's own
layer and an emptyDir are gone with the pod (run/pods.py, exit 2). `any` (the default): shipped wherever it lives,
and `plan`, `check` and the run log say where. On a plain host there is no layer to lose a file with: nothing to
refuse.
"""

from __future__ import annotations

from typing import Literal

Persist = Literal["any", "required"]
