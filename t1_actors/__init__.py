"""t1 actors: sampler, sandbox, verifier, critic, learner and staleness controller, and their runtime."""

__version__ = "0.1.0"
