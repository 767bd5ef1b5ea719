"""The SFT policy's teacher-forced imitation of held-out oracle chats (t1_actors/warmstart/heldout.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from t1_actors.warmstart.heldout import imitation, turns_right


def test_a_turn_is_right_only_when_each_of_its_tokens_is():
    target = np.array([5, 6, 7, 8, 9, 10, 11])
    mask = np.array([0, 1, 1, 0, 1, 0, 1])  # turns: positions 1-2, 4, 6
    assert turns_right(target.copy(), target, mask) == [True, True, True]
    wrong = target.copy()
    wrong[2], wrong[3] = 0, 0  # a miss inside turn 1, and one at a position no turn holds
    assert turns_right(wrong, target, mask) == [False, True, True]
    assert turns_right(target, target, np.zeros(7)) == []


class Successor(torch.nn.Module):
    """A policy whose greedy next token is always the current id + 1 (one-hot trunk, shift head)."""

    def __init__(self, vocab: int = 16):
        super().__init__()
        self.vocab = vocab
        self.lm_head = torch.nn.Linear(vocab, vocab, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.roll(torch.eye(vocab), 1, dims=0))

    def model(self, ids):
        return SimpleNamespace(hidden_states=torch.nn.functional.one_hot(ids, self.vocab).float())


def test_imitation_counts_turns_and_chats_per_family_from_the_greedy_tokens():
    counting = np.arange(1, 9)  # 1 2 3 ... 8: every next token the successor of the last
    broken = np.array([1, 2, 3, 9, 5, 6, 7, 8])  # 9 after 3: the successor policy says 4
    mask = np.array([0, 0, 1, 1, 0, 1, 1, 0], dtype=np.float32)  # turns at 2-3 and 5-6
    report = imitation(Successor(), [("count", (counting, mask)), ("count", (broken, mask)),
                                     ("other", (counting, mask))])
    assert report["families"]["count"] == {"turns": 4, "turns_right": 3, "chats": 2, "chats_right": 1}
    assert report["families"]["other"] == {"turns": 2, "turns_right": 2, "chats": 1, "chats_right": 1}
    assert report["turn_accuracy"] == round(5 / 6, 4) and report["chat_accuracy"] == round(2 / 3, 4)
    assert report["chats"] == 3 and imitation(Successor(), [])["chat_accuracy"] == 0.0
