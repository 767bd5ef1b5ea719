"""The reward of a verified trial, one function per equation: the recipe's dense count (``reward``, r = P / S)
and the binary all-pass reward (``binary_reward``, r = 1[P = N]); ``task_reward`` applies the one ``[verifier]
reward`` names. The verifier computes it (``t1_actors.verify.engine``) and logs it with its kind; PPO
(``t1_actors.train.ppo``, which re-exports these) puts it on a trajectory's last loss token.
"""

from __future__ import annotations

from typing import Literal

REWARD_SCALE = 20  # S of the recipe: fixed and global, never the task's own number of tests


def reward(passed: int, scale: int = REWARD_SCALE) -> float:
    """Dense verifier-count reward.

        r = P / S

    P = passing assertions of the task's own verifier, S = a fixed global scale (20), NOT the task's
    test count: a task with more checks can pay more, and r is comparable across tasks.
    """
    if passed < 0:
        raise ValueError(f"passed must be >= 0 (a count of passing tests), got {passed}")
    if scale <= 0:
        raise ValueError(f"reward scale S must be > 0, got {scale}")
    return passed / scale


RewardKind = Literal["dense", "binary"]  # [verifier] reward: which equation scores a verified trial


def binary_reward(passed: int, total: int) -> float:
    """Binary all-pass reward (the first T1 campaign's, which never exceeded its SFT baseline).

        r = 1[P = N and N > 0]

    P = passing tests, N = the tests the verifier ran: 1 when every test passed, else 0 (a run of no test is
    not a pass); the dense ``reward``'s partial credit is gone.
    """
    if passed < 0 or total < 0 or passed > total:
        raise ValueError(f"need 0 <= passed <= total, got passed={passed}, total={total}")
    return 1.0 if total > 0 and passed == total else 0.0


def task_reward(kind: RewardKind, passed: int, total: int, scale: int = REWARD_SCALE) -> float:
    """The reward of a verified trial under ``[verifier] reward``: ``reward`` (dense, r = P / S) or
    ``binary_reward`` (r = 1[P = N])."""
    if kind == "dense":
        return reward(passed, scale)
    if kind == "binary":
        return binary_reward(passed, total)
    raise ValueError(f"reward kind must be 'dense' or 'binary', got {kind!r}")
