"""The role table: which Actor class plays each of the six roles (``t1-actor ROLE``, ``launch``, ``check``)."""

from __future__ import annotations

from t1_actors.critic import CriticActor
from t1_actors.learner import LearnerActor
from t1_actors.runtime.actor import Actor
from t1_actors.sampler import SamplerActor
from t1_actors.sandbox import SandboxActor
from t1_actors.staleness import StalenessActor
from t1_actors.verifier import VerifierActor

ROLES: dict[str, type[Actor]] = {
    "sampler": SamplerActor,
    "sandbox": SandboxActor,
    "verifier": VerifierActor,
    "critic": CriticActor,
    "learner": LearnerActor,
    "staleness": StalenessActor,
}
