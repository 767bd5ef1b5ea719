"""Random renaming of an oracle chat's names, so SFT can fit them only by copying them from the context.

The synthetic corpus draws its file and directory names and the words inside its files from small vocabularies
(``t1_actors.tasks.synthetic.RENAMEABLE``). An SFT policy can fit its chats by memorising which names go with
which instruction as well as by copying them, and on long.toml's pool the seeds that memorised never learned to
copy (docs/long_horizons.md). ``Renamer`` rewrites a chat's texts (instruction, commands, tool outputs) under
one random permutation of each vocabulary: the same chat with other names, as valid as the original (the
outputs were printed by the original names' files, and a listing's order stays the order the chat shows).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from t1_actors.warmstart.finetune import OracleExample, oracle_messages, sft_example


class Renamer:
    """A random permutation of each vocabulary, applied to whole words (``\\b`` boundaries: ``/app/oak.txt``
    renames ``oak``, ``oaks`` stays)."""

    def __init__(self, vocabularies: Sequence[Sequence[str]]):
        self.vocabularies = [list(dict.fromkeys(vocabulary)) for vocabulary in vocabularies]
        words = [word for vocabulary in self.vocabularies for word in vocabulary]
        if len(words) != len(set(words)):
            raise ValueError("a word is in two vocabularies: a permutation of each would rename it twice")
        if not words:
            raise ValueError("no word to rename")
        self._pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(words, key=len, reverse=True))) + r")\b")

    def __call__(self, texts: Sequence[str], rng: random.Random) -> list[str]:
        """``texts`` under one fresh permutation of each vocabulary (the same one for every text)."""
        mapping = {}
        for vocabulary in self.vocabularies:
            mapping.update(zip(vocabulary, rng.sample(vocabulary, len(vocabulary))))
        return [self._pattern.sub(lambda match: mapping[match.group(1)], text) for text in texts]


@dataclass
class RenamedExamples:
    """``supervised_finetune``'s ``rewrite``: an ``OracleExample`` rendered again on t1's own template under a
    random renaming (``Renamer``); any other example as it is."""

    renamer: Renamer
    tokenizer: object
    tool_output_chars: int

    def __call__(self, example, rng: random.Random):
        if not isinstance(example, OracleExample):
            return example
        instruction, *rest = self.renamer([example.instruction, *example.commands, *example.outputs], rng)
        commands, outputs = rest[: len(example.commands)], rest[len(example.commands):]
        return sft_example(oracle_messages(instruction, commands, outputs, self.tool_output_chars), self.tokenizer)
