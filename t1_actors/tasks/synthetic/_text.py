"""Families of text work: writing lines, sorting, slicing, search and replace, counting, aggregation."""

from __future__ import annotations

import random

from t1_actors.tasks.synthetic._draft import NAMES, WORDS, Check, Draft, Family, distinct, lines_of_words, text


def write_lines(rng: random.Random) -> Draft:
    """Write one word to a new file, then append a second."""
    name = rng.choice(NAMES)
    first, second = distinct(rng, WORDS, 2)
    path = f"/app/{name}.txt"
    return Draft(
        instruction=f"Write the word '{first}' to {path}, then append the word '{second}' as a second line.",
        commands=[f"echo '{first}' > {path}", f"echo '{second}' >> {path}"],
        checks=[
            Check("file_exists", f"assert Path({path!r}).is_file()"),
            Check("first_line", f"assert lines({path!r})[:1] == [{first!r}]"),
            Check("second_line", f"assert lines({path!r})[1:2] == [{second!r}]"),
            Check("two_lines", f"assert len(lines({path!r})) == 2"),
        ],
    )


def sort_unique(rng: random.Random) -> Draft:
    """Sort a file without duplicates into another, then count its lines."""
    source, target, count = distinct(rng, NAMES, 3)
    words = distinct(rng, WORDS, rng.randint(3, 7))
    body = [rng.choice(words) for _ in range(rng.randint(6, 12))] + words  # every word at least once
    rng.shuffle(body)
    src, dst, cnt = f"/app/{source}.txt", f"/app/{target}.txt", f"/app/{count}.txt"
    unique = sorted(set(body))
    return Draft(
        instruction=f"Sort the lines of {src} without duplicates into {dst}, then write its line count to {cnt}.",
        commands=[f"sort -u {src} > {dst}", f"wc -l < {dst} > {cnt}"],
        checks=[
            Check("sorted_exists", f"assert Path({dst!r}).is_file()"),
            Check("sorted_order", f"assert lines({dst!r}) == sorted(lines({dst!r})) and lines({dst!r})"),
            Check("no_duplicates", f"assert len(set(lines({dst!r}))) == len(lines({dst!r})) > 0"),
            Check("same_lines", f"assert sorted(set(lines({dst!r}))) == {unique!r}"),
            Check("source_unchanged", f"assert read({src!r}) == {text(body)!r}"),
            Check("count_written", f"assert number({cnt!r}) == {len(unique)}"),
        ],
        files={src: text(body)},
    )


def head_tail(rng: random.Random) -> Draft:
    """Save the first N and the last M lines of a file."""
    source, first_name, last_name = distinct(rng, NAMES, 3)
    body = [f"{rng.choice(WORDS)} {i}" for i in range(1, rng.randint(10, 16))]
    first_n, last_m = rng.randint(1, 9), rng.randint(1, 9)
    src, first, last = f"/app/{source}.txt", f"/app/{first_name}.txt", f"/app/{last_name}.txt"
    return Draft(
        instruction=f"Save the first {first_n} lines of {src} to {first} and the last {last_m} lines to {last}.",
        commands=[f"head -n {first_n} {src} > {first}", f"tail -n {last_m} {src} > {last}"],
        checks=[
            Check("head_exists", f"assert Path({first!r}).is_file()"),
            Check("head_length", f"assert len(lines({first!r})) == {first_n}"),
            Check("head_content", f"assert lines({first!r}) == {body[:first_n]!r}"),
            Check("tail_exists", f"assert Path({last!r}).is_file()"),
            Check("tail_length", f"assert len(lines({last!r})) == {last_m}"),
            Check("tail_content", f"assert lines({last!r}) == {body[-last_m:]!r}"),
            Check("source_unchanged", f"assert read({src!r}) == {text(body)!r}"),
        ],
        files={src: text(body)},
    )


def replace_word(rng: random.Random) -> Draft:
    """Replace a word everywhere in a file, then save the lines that now hold the new word."""
    name, matches = distinct(rng, NAMES, 2)
    old, new = distinct(rng, WORDS, 2)
    others = [w for w in WORDS if w not in (old, new)]
    body = lines_of_words(rng, rng.randint(3, 6), others) + [f"{old} {w}" for w in distinct(rng, others, 2)]
    body += [old] * rng.randint(0, 2)
    rng.shuffle(body)
    after = [" ".join(new if w == old else w for w in line.split()) for line in body]
    new_count = text(after).split().count(new)
    path, out = f"/app/{name}.txt", f"/app/{matches}.txt"
    return Draft(
        instruction=f"In {path} replace every '{old}' with '{new}', then save the lines containing '{new}' to {out}.",
        commands=[f"sed -i 's/{old}/{new}/g' {path}", f"grep '{new}' {path} > {out}"],
        checks=[
            Check("old_word_gone", f"assert {old!r} not in read({path!r}).split()"),
            Check("new_word_count", f"assert read({path!r}).split().count({new!r}) == {new_count}"),
            Check("text_replaced", f"assert lines({path!r}) == {after!r}"),
            Check("matches_exist", f"assert Path({out!r}).is_file()"),
            Check("matches_content", f"assert lines({out!r}) == {[line for line in after if new in line.split()]!r}"),
        ],
        files={path: text(body)},
    )


def count_matches(rng: random.Random) -> Draft:
    """Count the lines holding a word, and all lines."""
    name = rng.choice(NAMES)
    word = rng.choice(WORDS)
    others = [w for w in WORDS if w != word]
    body = lines_of_words(rng, rng.randint(3, 9), others) + [f"{rng.choice(others)} {word}"
                                                            for _ in range(rng.randint(1, 6))]
    rng.shuffle(body)
    path = f"/app/{name}.txt"
    hits = sum(word in line.split() for line in body)
    return Draft(
        instruction=(f"Write the number of lines of {path} that contain '{word}' to /app/count.txt, "
                     f"and its total number of lines to /app/total.txt."),
        commands=[f"grep -c '{word}' {path} > /app/count.txt", f"wc -l < {path} > /app/total.txt"],
        checks=[
            Check("count_exists", "assert Path('/app/count.txt').is_file()"),
            Check("count_correct", f"assert number('/app/count.txt') == {hits}"),
            Check("total_exists", "assert Path('/app/total.txt').is_file()"),
            Check("total_correct", f"assert number('/app/total.txt') == {len(body)}"),
        ],
        files={path: text(body)},
    )


def sum_column(rng: random.Random) -> Draft:
    """Sum one column of a CSV file and find its largest value."""
    name, sum_name, max_name = distinct(rng, NAMES, 3)
    total, largest = f"/app/{sum_name}.txt", f"/app/{max_name}.txt"
    columns = rng.randint(2, 4)
    column = rng.randint(1, columns)
    rows = [[rng.randint(1, 99) for _ in range(columns)] for _ in range(rng.randint(3, 8))]
    path = f"/app/{name}.csv"
    values = [row[column - 1] for row in rows]
    return Draft(
        instruction=(f"Add up column {column} of {path} and write the sum to {total}, "
                     f"and its largest value to {largest}."),
        commands=[f"cut -d, -f {column} {path} | awk '{{s+=$1}} END {{print s}}' > {total}",
                  f"cut -d, -f {column} {path} | sort -n | tail -n 1 > {largest}"],
        checks=[
            Check("sum_exists", f"assert Path({total!r}).is_file()"),
            Check("sum_correct", f"assert number({total!r}) == {sum(values)}"),
            Check("max_exists", f"assert Path({largest!r}).is_file()"),
            Check("max_correct", f"assert number({largest!r}) == {max(values)}"),
        ],
        files={path: text([",".join(map(str, row)) for row in rows])},
    )


def grep_split(rng: random.Random) -> Draft:
    """Split a log into the lines that hold a word and the rest."""
    log, hits_name, rest_name = distinct(rng, NAMES, 3)
    word = rng.choice(WORDS)
    others = [w for w in WORDS if w != word]
    body = lines_of_words(rng, rng.randint(2, 6), others) + [f"{word} {rng.choice(others)}"
                                                            for _ in range(rng.randint(1, 4))]
    rng.shuffle(body)
    src, hits, rest = f"/app/{log}.log", f"/app/{hits_name}.txt", f"/app/{rest_name}.txt"
    return Draft(
        instruction=f"Save the lines of {src} that contain '{word}' to {hits} and all other lines to {rest}.",
        commands=[f"grep '{word}' {src} > {hits}", f"grep -v '{word}' {src} > {rest}"],
        checks=[
            Check("hits_exist", f"assert Path({hits!r}).is_file()"),
            Check("hits_content", f"assert lines({hits!r}) == {[line for line in body if word in line.split()]!r}"),
            Check("rest_exist", f"assert Path({rest!r}).is_file()"),
            Check("rest_content", f"assert lines({rest!r}) == {[line for line in body if word not in line.split()]!r}"),
            Check("source_unchanged", f"assert read({src!r}) == {text(body)!r}"),
        ],
        files={src: text(body)},
    )


FAMILIES = (
    Family("write_lines", "text", write_lines),
    Family("sort_unique", "text", sort_unique),
    Family("head_tail", "text", head_tail),
    Family("replace_word", "search_replace", replace_word),
    Family("count_matches", "counting", count_matches),
    Family("sum_column", "aggregation", sum_column),
    Family("grep_split", "search", grep_split),
)
