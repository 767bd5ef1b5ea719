"""A deliberately slow sampler for the staleness test: the real SamplerActor, waiting before each turn.

Loaded by the campaign through ``[[actors]] actor_class = "slow_sampler:SlowSampler"`` (the test puts
tests/ on PYTHONPATH), so trials straddle policy versions and some arrive too stale to admit.
"""

from __future__ import annotations

import trio

from schemas import GenerateReply, GenerateRequest
from t1_actors.runtime.actor import handles
from t1_actors.sampler import SamplerActor

DELAY_S = 1.5


class SlowSampler(SamplerActor):
    @handles(GenerateRequest, graceful_cancel=True)
    async def generate(self, request: GenerateRequest) -> GenerateReply:
        if request.trial_id.rsplit("-", 2)[-2] == "train":  # evals stay fast; only training trials lag
            await trio.sleep(DELAY_S * (1 + int(request.trial_id[-1]) % 3))
        return await super().generate(request)
