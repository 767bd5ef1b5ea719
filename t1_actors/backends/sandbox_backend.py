"""The sandbox backends behind one interface: ``[sandbox]`` names the backend and holds each one's settings;
``open_backend`` makes the configured one (``local``: bubblewrap on this host; ``daytona``: the Daytona SDK)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from t1_actors.backends.daytona_sandbox import DaytonaSandboxBackend, DaytonaSandboxConfig
from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig


class SandboxConfig(BaseModel):
    """The run's ``[sandbox]`` section: which backend, and each backend's settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["local", "daytona"] = Field(
        "local", description="local: bubblewrap sandboxes on the sandbox actor's host ([sandbox.local]); daytona: "
                             "remote Daytona sandboxes ([sandbox.daytona], the daytona extra). SFT's "
                             "oracles always run in local ones")
    local: LocalSandboxConfig = Field(default_factory=LocalSandboxConfig,
                                      description="the local backend's settings: the [sandbox.local] table")
    daytona: DaytonaSandboxConfig = Field(default_factory=DaytonaSandboxConfig,
                                          description="the Daytona backend's settings: the [sandbox.daytona] table")


def open_backend(config: SandboxConfig, *, sweep: bool = True) -> Any:
    """The configured backend (blocking: run it in a thread). ``sweep`` False: a local backend leaves the trial
    roots of dead processes for the caller to take over (``LocalSandboxBackend.adopt``), then to sweep."""
    if config.backend == "daytona":
        return DaytonaSandboxBackend(config.daytona)

    return LocalSandboxBackend(config.local, sweep=sweep)
