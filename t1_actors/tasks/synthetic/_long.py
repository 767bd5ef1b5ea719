"""Long families: oracles of 8-14 turns where each step depends on what an earlier command printed.

The single-turn families put every parameter in the instruction; here the instruction names only where to
start, and the rest is read along the way, so no policy can write the commands from the instruction alone:

- ``chain``: files each naming the next (``next /app/D/plum.txt``) or closing the chain (``end 'song'``),
  among decoys never on it (some say ``end`` too); the agent appends each visited path to a trail file and
  writes the end word to an answer file. One check per stage visited, in order, plus the trail and answer.
- ``pipeline``: stage files each giving a filter (``sort -r``, ``head -n 3``, ``grep -v 'cat'``, ...) and
  the next stage, or ``end``; each stage filters the previous stage's output into a new directory, under its
  own file's name (so its input is named by the stage file read two steps before). One check per stage's
  output, and one that no decoy stage ran.
- ``explore``: a tree of subdirectories whose files holding a word are listed by one ``grep -l`` over the
  whole tree; each listed file is copied out, one command each, long after the listing. One check per file
  copied.

Copyability, as in the package docstring: what a command copies from an output is the same token there
(whole paths ``/app/D/plum.txt``, quoted words ``'song'``, filters verbatim). A bare name is not: ``ls /app/D``
prints ``plum`` (``pl um``), a path spells it ``/plum`` (one token with ``[campaign] tokenizer_path_components``).
Every output an oracle prints is a few lines, under the harness's 240 characters (``tool_output_chars``), so
nothing the agent needs is cut.
Stage names, filters, words and files after the first step never appear in the instruction.

These families are not in the default set (``FAMILIES``): a run asks for them by name (``[tasks] families``).
"""

from __future__ import annotations

import random

from t1_actors.tasks.synthetic._draft import NAMES, WORDS, Check, Draft, Family, distinct, identifier, text

# A task's own turn cap wins over [campaign] max_turns: the default (8) is below these oracles' 8-14 turns (and
# their answer turn), so a long task lets the run's cap decide, up to 40 turns, with the wall time to match.
LIMITS = {"max_turns": 40, "agent_timeout_s": 600.0}


def _chain_body(paths: list[str], index: int, word: str) -> str:
    """The text of chain file ``index``: the next path, or the end word for the last one."""
    return f"next {paths[index + 1]}\n" if index + 1 < len(paths) else f"end '{word}'\n"


def chain(rng: random.Random) -> Draft:
    """Follow a chain of 4-6 files, each naming the next, with decoys; record the trail and the end word."""
    stages = rng.randint(4, 6)
    decoys = rng.randint(3, 5)
    directory, trail_name, answer_name, *names = distinct(rng, NAMES, 3 + stages + decoys)
    path = [f"/app/{directory}/{name}.txt" for name in names[:stages]]
    decoy_paths = [f"/app/{directory}/{name}.txt" for name in names[stages:]]
    word, *other_words = distinct(rng, WORDS, 1 + decoys)
    files: dict[str, str | bytes] = {p: _chain_body(path, i, word) for i, p in enumerate(path)}
    for i, decoy in enumerate(decoy_paths):  # dead ends: another end word, or a way into the chain or a decoy
        if i < 2:
            files[decoy] = f"end '{other_words[i]}'\n"
        else:
            files[decoy] = f"next {rng.choice(path[1:] + decoy_paths[:i])}\n"
    trail, answer = f"/app/{trail_name}.txt", f"/app/{answer_name}.txt"
    commands = []
    for p in path:
        commands += [f"echo {p} >> {trail}", f"cat {p}"]
    commands.append(f"echo '{word}' > {answer}")
    checks = [Check(identifier("visited", str(k), name), f"assert lines({trail!r})[:{k}] == {path[:k]!r}")
              for k, name in enumerate(names[:stages], 1)]
    checks += [
        Check("trail_stops_at_end", f"assert lines({trail!r}) == {path!r}"),
        Check("answer_written", f"assert lines({answer!r}) == [{word!r}]"),
    ]
    return Draft(
        instruction=(f"Follow the chain of files from {path[0]}: each says next and the next file, or end and a "
                     f"word. Append the path of each file you read to {trail}, then write the end word to {answer}."),
        commands=commands,
        checks=checks,
        files=files,
        limits=LIMITS,
    )


def _apply(spec: str, lines: list[str]) -> list[str]:
    """What the filter ``spec`` (a stage file's line) prints for input ``lines``, as the shell tool would
    (LANG=C.UTF-8: sort is codepoint order; the words are plain lowercase letters, so grep matches
    literally)."""
    op, *args = spec.split(" ", 1)
    arg = args[0] if args else ""
    if spec == "sort":
        return sorted(lines)
    if spec == "sort -r":
        return sorted(lines, reverse=True)
    if spec == "sort -u":
        return sorted(set(lines))
    if spec == "uniq":
        return [line for i, line in enumerate(lines) if i == 0 or lines[i - 1] != line]
    if op in ("head", "tail"):
        count = int(arg.split()[1])
        return lines[:count] if op == "head" else lines[-count:]
    if op == "grep":
        invert, word = arg.startswith("-v "), arg.split("'")[1]
        return [line for line in lines if (word in line) != invert]
    raise ValueError(f"unknown filter {spec!r}")


def _filter(rng: random.Random, lines: list[str]) -> str:
    """A filter drawn for ``lines``, its parameters taken from them (a word they hold, a count they have).

    No ``sed``: its words were the pipeline's one piece no policy copied (``s/door/`` is ``/d o or`` to t1's
    path-component tokenizer, a spelling found nowhere else; 2-10 % on the right piece, teacher-forced on
    long.toml's SFT policy t0, docs/long_horizons.md)."""
    kind = rng.choice(("sort", "sort -r", "sort -u", "uniq", "head", "tail", "grep", "grep -v"))
    if kind in ("head", "tail"):
        return f"{kind} -n {rng.randint(2, max(2, len(lines) - 1))}"
    if kind in ("grep", "grep -v"):
        return f"{kind} '{rng.choice(lines)}'"
    return kind


def _stages(rng: random.Random, data: list[str], count: int) -> list[tuple[str, list[str]]] | None:
    """``count`` filters, each changing its input and leaving at least two lines, with their outputs."""
    stages: list[tuple[str, list[str]]] = []
    current = data
    for _ in range(count):
        for _attempt in range(40):
            spec = _filter(rng, current)
            output = _apply(spec, current)
            if output != current and len(output) >= 2 and spec not in {s for s, _ in stages}:
                break
        else:
            return None
        stages.append((spec, output))
        current = output
    return stages


def pipeline(rng: random.Random) -> Draft:
    """Run a pipeline of 4-6 stage files, each giving a filter and the next stage: a stage filters the output
    of the one before into a new directory, under its own file's name. The filters are only in the stage
    files, and each stage's input is named by the stage file read two steps before."""
    count = rng.randint(4, 6)
    stages = None
    while stages is None:  # a rare input no filters fit: draw another
        vocabulary = distinct(rng, WORDS, rng.randint(4, 6))
        data = [rng.choice(vocabulary) for _ in range(rng.randint(8, 12))]
        stages = _stages(rng, data, count)
    decoys = rng.randint(2, 3)
    directory, source_name, out, *names = distinct(rng, NAMES, 3 + count + decoys)
    stage_paths = [f"/app/{directory}/{name}.txt" for name in names[:count]]
    source = f"/app/{source_name}.txt"
    files: dict[str, str | bytes] = {source: text(data)}
    for k, (spec, _) in enumerate(stages):
        files[stage_paths[k]] = f"{spec}\n" + (f"next {stage_paths[k + 1]}\n" if k + 1 < count else "end\n")
    for name in names[count:]:  # stages never reached: a filter of their own, leading back or ending
        tail = f"next {rng.choice(stage_paths[1:])}\n" if rng.random() < 0.5 else "end\n"
        files[f"/app/{directory}/{name}.txt"] = f"{_filter(rng, data)}\n{tail}"
    commands, checks = [f"mkdir /app/{out}"], []
    previous = source
    for k, (spec, output) in enumerate(stages, 1):
        target = f"/app/{out}/{names[k - 1]}.txt"
        commands += [f"cat {stage_paths[k - 1]}", f"{spec} < {previous} > {target}"]
        checks.append(Check(identifier("stage", str(k), names[k - 1]), f"assert lines({target!r}) == {output!r}"))
        previous = target
    checks.append(Check("only_the_pipeline_ran", f"assert sorted(os.listdir({f'/app/{out}'!r})) == "
                                                 f"{sorted(f'{name}.txt' for name in names[:count])!r}"))
    return Draft(
        instruction=(f"Run the pipeline from {stage_paths[0]}: each stage file gives a filter, then next and the "
                     f"next stage file, or end. Each stage filters the output of the one before (the first filters "
                     f"{source}) into the new directory /app/{out}, under its stage file's name."),
        commands=commands,
        checks=checks,
        files=files,
        limits=LIMITS,
    )


def explore(rng: random.Random) -> Draft:
    """Find the files holding a word in a tree of 2-3 subdirectories (one ``grep -l`` over ``/app/R/*/*``) and
    copy each of the 6-8 into a new directory, one ``cp`` a turn: every file to copy is known only from that
    listing, printed whole (the paths a ``cp`` copies), and the k-th copy reads it k turns back.

    Why one listing: the tree used to be listed by ``ls -d``, then grepped one subdirectory at a time; the SFT
    policy's distribution over the subdirectory to grep next was flat over every name (p 0.3-3 %, teacher-forced
    on long.toml's SFT policy t0, docs/long_horizons.md), while it copied a path from an output turn after turn.
    The glob lists in sorted order, so the oracle's order is the listing's."""
    while True:  # the listing must fit the harness's 240-character cut of an output: redraw the rare long one
        subdirs = rng.randint(2, 3)
        matching = rng.randint(6, 8)
        others = rng.randint(2, 4)
        root, target, *names = distinct(rng, NAMES, 2 + subdirs + matching + others)
        dirs, stems = sorted(names[:subdirs]), names[subdirs:]
        homes = dirs + [rng.choice(dirs) for _ in range(matching - subdirs)]  # each subdirectory holds a match
        found = sorted(f"/app/{root}/{d}/{stem}.txt" for d, stem in zip(homes, stems[:matching]))
        if sum(len(path) + 1 for path in found) <= 230:
            break
    word = rng.choice(WORDS)
    plain = [w for w in WORDS if word not in w]
    files: dict[str, str | bytes] = {}
    for path in found:
        body = [" ".join(rng.choice(plain) for _ in range(rng.randint(1, 2))) for _ in range(rng.randint(0, 2))]
        body.insert(rng.randint(0, len(body)), " ".join(rng.sample([word, rng.choice(plain)], 2)))
        files[path] = text(body)
    for stem in stems[matching:]:  # the rest hold other words only
        lines = [" ".join(rng.choice(plain) for _ in range(rng.randint(1, 2))) for _ in range(rng.randint(1, 3))]
        files[f"/app/{root}/{rng.choice(dirs)}/{stem}.txt"] = text(lines)
    copies = {path.rsplit("/", 1)[1]: path for path in found}
    commands = [f"mkdir /app/{target}", f"grep -l '{word}' /app/{root}/*/*"]
    commands += [f"cp {path} /app/{target}/" for path in found]
    checks = [Check("target_is_directory", f"assert Path({f'/app/{target}'!r}).is_dir()")]
    checks += [Check(identifier("copied", name), f"assert read({f'/app/{target}/{name}'!r}) == {files[path]!r}")
               for name, path in sorted(copies.items())]
    checks.append(Check("only_matches_copied", f"assert sorted(os.listdir({f'/app/{target}'!r})) == "
                                               f"{sorted(copies)!r}"))
    return Draft(
        instruction=(f"Find every file in the subdirectories of /app/{root} that holds the word '{word}' and copy "
                     f"it into the new directory /app/{target}."),
        commands=commands,
        checks=checks,
        files=files,
        limits=LIMITS,
    )


FAMILIES = (
    Family("chain", "long", chain),
    Family("pipeline", "long", pipeline),
    Family("explore", "long", explore),
)
