"""Rollout: playing trials and turning them into training data.

    loop       the agent loop of one trial: render -> sample -> parse tool calls -> execute -> repeat
    trials     orchestration over ``TrialPorts``: eval, warm-up and RL batches; TITO assembly per trial
    eval_pass  one eval pass and its ``EvalResult``; a pass a dead controller left half played goes on from it
    admission  the staleness rules: policy lag, admission, oversampling, the tail's length bias
    opens      a sandbox that cannot be opened: the trial an infrastructure failure, throttled, bounded
    inprocess  ``TrialPorts`` over real engines in one process (``t1-probe``, ``t1-actor eval``, tests)

TITO itself (``t1_actors.tito``) is its own package: custom harnesses call it directly.
"""

from t1_actors.rollout.loop import (
    SYSTEM_PROMPT,
    ExecPort,
    RolloutLimits,
    SamplePort,
    ToolOutcome,
    TrialRollout,
    TurnRecord,
    assistant_message,
    first_messages,
    run_trial,
    truncate_output,
)

__all__ = ["SYSTEM_PROMPT", "ExecPort", "RolloutLimits", "SamplePort", "ToolOutcome", "TrialRollout", "TurnRecord",
           "assistant_message", "first_messages", "run_trial", "truncate_output"]
