"""Byte-level BPE tokenizer (Hugging Face ``tokenizers``) with the chat template's special tokens.

    tok = train_tokenizer(texts, vocab_size=1024)      # e.g. rendered chats of the task corpus
    tok = load_tokenizer("path/to/tokenizer.json")     # a ChatTokenizer (also HF dirs: see chat_tokenizer)
    tok = default_tokenizer()                          # the small committed default (generic shell chats)

``train_tokenizer`` returns the bare ``tokenizers.Tokenizer``; ``load_tokenizer`` (from ``chat_tokenizer``)
and ``default_tokenizer`` return a ``ChatTokenizer`` (encode/decode/apply_chat_template).

    python -m t1_actors.policy.tokenizer --out tokenizer.json [--vocab-size 1024] [--texts FILE ...]

Special tokens come first (ids 0..), so a model's vocabulary always covers them. Byte-level BPE never
fails to encode: every byte has a token.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from t1_actors.policy.chat_template import render_chat
from t1_actors.policy.chat_tokenizer import MARKERS, ChatTokenizer, as_chat_tokenizer, load_tokenizer

SPECIAL_TOKENS = list(MARKERS)  # the chat template's markers, ids 0.. in this order
DEFAULT_TOKENIZER = Path(__file__).resolve().parent.parent / "assets" / "tokenizer.json"


# GPT-2's pre-tokenizer pattern (what ByteLevel's use_regex applies), with a path component first: "/lunar"
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PATH_COMPONENT_PATTERN = r"/\p{L}+|" + GPT2_PATTERN


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024, *, path_components: bool = False) -> Tokenizer:
    """Train a byte-level BPE of ``vocab_size`` ids (special tokens and the 256 bytes included).

    ``path_components``: a slash stays on the word after it (``/app/lunar/thorn.txt`` -> ``Ġ/ app /lunar
    /thorn . txt``), so each name of a path follows a token of its own. With GPT-2's pattern every name
    follows the same ``/``, and which one comes next must be read from further back (docs/long_horizons.md)."""
    minimum = len(SPECIAL_TOKENS) + 256
    if vocab_size < minimum:
        raise ValueError(f"vocab_size {vocab_size} is below {minimum} (special tokens + 256 byte tokens)")
    tokenizer = Tokenizer(models.BPE())
    if path_components:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PATH_COMPONENT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def default_tokenizer() -> ChatTokenizer:
    """The committed default, trained on rendered chats of generic shell work (``generic_shell_chats``)."""
    return load_tokenizer(DEFAULT_TOKENIZER)


def special_token_ids(tokenizer: ChatTokenizer | Tokenizer) -> dict[str, int]:
    """Id of each special token the tokenizer knows (chat template markers, end of text; for an HF
    tokenizer also its named special tokens)."""
    return as_chat_tokenizer(tokenizer).special_token_ids()


def generic_shell_chats(n: int, seed: int = 0) -> Iterator[str]:
    """Rendered chats of everyday shell work: the corpus of the committed default tokenizer."""
    rng = random.Random(seed)
    words = ["app", "data", "logs", "config", "report", "notes", "backup", "src", "tests", "output", "input",
             "users", "alpha", "beta", "gamma", "delta", "result", "hello", "world", "README", "main", "value",
             "count", "server", "client", "cache", "build", "release", "index", "table", "records", "error",
             "warning", "status", "summary", "archive", "scripts", "docs", "images", "home", "tmp", "var", "etc",
             "lib", "bin", "share", "local", "user", "admin", "system", "network", "package", "version", "total",
             "first", "last", "line", "lines", "word", "words", "file", "files", "name", "names", "number",
             "numbers", "text", "date", "time", "size", "path", "list", "item", "items", "key", "keys", "price",
             "city", "color", "green", "blue", "red", "apple", "banana", "orange", "north", "south", "east", "west"]
    tasks = ["Task: in {d}, work on {f} so that it holds {w} {k} times.", "Create {f} containing the word {w}.",
             "Count the lines of {f} and write the number to {d}/count.txt.", "Replace every {w} with {w2} in {f}.",
             "Sort the {w} entries of {f} and save them as {d}/{w2}.{e}.", "Make {f} executable and run it.",
             "Find all .{e} files under {d} and list their names in {d}/{w2}.txt.",
             "Extract column {k} of {f} (comma separated) into {d}/{w2}.csv.", "Archive {d} into {d}.tar.gz.",
             "Print the {k} last lines of {f} to {d}/tail.txt.", "The file {f} has a typo: {w} should be {w2}. Fix it."]
    exts = ["txt", "csv", "json", "log", "py", "sh", "md", "yaml", "conf"]
    commands = [
        "ls -la {d}", "cat {f}", "mkdir -p {d}", "echo '{w}' > {f}", "echo {w} >> {f}", "wc -l {f}",
        "grep -n '{w}' {f}", "sed -i 's/{w}/{w2}/g' {f}", "sort {f} | uniq -c", "head -n {k} {f}",
        "tail -n {k} {f}", "cp {f} {d}/", "mv {f} {d}/{w2}.{e}", "rm -f {f}", "touch {f}", "chmod +x {f}",
        "find {d} -name '*.{e}'", "cut -d, -f{k} {f}", "awk '{{print ${k}}}' {f}", "tr a-z A-Z < {f} > {f}",
        "python3 -c 'print({k}*{k2})'", "tar czf {d}.tar.gz {d}", "printf '%s\\n' {w} {w2} > {f}",
        "cd {d} && ls", "test -f {f} && echo yes", "du -sh {d}", "diff {f} {d}/{w2}.{e}", "jq '.{w}' {f}",
    ]
    for _ in range(n):
        w, w2, e = rng.choice(words), rng.choice(words), rng.choice(exts)
        d = "/" + "/".join(rng.sample(words, rng.randint(1, 3)))
        f = f"{d}/{w}.{e}"
        k, k2 = rng.randint(1, 20), rng.randint(1, 99)
        steps = [rng.choice(commands).format(d=d, f=f, w=w, w2=w2, e=e, k=k, k2=k2) for _ in range(rng.randint(1, 3))]
        chat = [{"role": "system", "content": "You are a terminal agent. Run bash commands to solve the task."},
                {"role": "user", "content": rng.choice(tasks).format(d=d, f=f, w=w, w2=w2, e=e, k=k)}]
        for command in steps:
            chat.append({"role": "assistant", "content": "",
                         "tool_calls": [{"name": "bash", "arguments": {"command": command}}]})
            output = rng.choice(["", f"{w}\n", f"{k} {f}\n", "No such file or directory\n", f"{w2} {k2}\n"])
            chat.append({"role": "tool", "content": f"exit_code: {rng.choice([0, 0, 0, 1])}\n{output}"})
        chat.append({"role": "assistant", "content": "Done."})
        yield render_chat(chat)


def _read_texts(paths: list[str]) -> Iterator[str]:
    """Lines of .jsonl files (a string, a {"text"} object or a chat message list) or whole text files."""
    for name in paths:
        path = Path(name)
        if path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                item = json.loads(line)
                if isinstance(item, list):
                    yield render_chat(item)
                elif isinstance(item, dict) and "messages" in item:
                    yield render_chat(item["messages"])
                else:
                    yield item["text"] if isinstance(item, dict) else str(item)
        else:
            yield path.read_text()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m t1_actors.policy.tokenizer",
                                     description="Train the byte-level BPE tokenizer and write tokenizer.json.")
    parser.add_argument("--out", required=True, help="where to write tokenizer.json")
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--texts", nargs="*", default=[],
                        help=".jsonl (strings, {'text'}, chats) or text files; default: generic shell chats")
    parser.add_argument("--generic-chats", type=int, default=20000, help="generic shell chats when no --texts")
    args = parser.parse_args(argv)
    texts = _read_texts(args.texts) if args.texts else generic_shell_chats(args.generic_chats)
    tokenizer = train_tokenizer(texts, vocab_size=args.vocab_size)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out))
    print(json.dumps({"out": str(out), "vocab_size": tokenizer.get_vocab_size()}))


if __name__ == "__main__":
    main()
