"""Families of file and directory work: make, move, copy, rename, delete by pattern, permissions."""

from __future__ import annotations

import random

from t1_actors.tasks.synthetic._draft import (
    EXTENSIONS,
    NAMES,
    Check,
    Draft,
    Family,
    distinct,
    identifier,
    lines_of_words,
    text,
)


def _content(rng: random.Random) -> str:
    return text(lines_of_words(rng, rng.randint(1, 4)))


def mkdir_move(rng: random.Random) -> Draft:
    """Create a directory and move one to three files into it; a bystander file stays."""
    directory, *names = distinct(rng, NAMES, 1 + rng.randint(1, 3) + 1)
    moved, bystander = names[:-1], names[-1]
    files = {f"/app/{name}.txt": _content(rng) for name in names}
    sources = " ".join(f"/app/{name}.txt" for name in moved)
    checks = [Check("directory_exists", f"assert Path({f'/app/{directory}'!r}).is_dir()")]
    for name in moved:
        source, target = f"/app/{name}.txt", f"/app/{directory}/{name}.txt"
        checks += [
            Check(identifier("moved", name), f"assert read({target!r}) == {files[source]!r}"),
            Check(identifier("source_gone", name), f"assert not Path({source!r}).exists()"),
        ]
    keep = f"/app/{bystander}.txt"
    checks.append(Check(identifier("kept", bystander), f"assert read({keep!r}) == {files[keep]!r}"))
    return Draft(
        instruction=f"Create the directory /app/{directory} and move {sources} into it.",
        commands=[f"mkdir /app/{directory}", f"mv {sources} /app/{directory}/"],
        checks=checks,
        files=files,
    )


def copy_rename(rng: random.Random) -> Draft:
    """Copy one file and rename another."""
    a, b, c, d = distinct(rng, NAMES, 4)
    files = {f"/app/{a}.txt": _content(rng), f"/app/{c}.txt": _content(rng)}
    copy_src, copy_dst, old, new = f"/app/{a}.txt", f"/app/{b}.txt", f"/app/{c}.txt", f"/app/{d}.txt"
    return Draft(
        instruction=f"Copy {copy_src} to {copy_dst} and rename {old} to {new}.",
        commands=[f"cp {copy_src} {copy_dst}", f"mv {old} {new}"],
        checks=[
            Check("copy_exists", f"assert Path({copy_dst!r}).is_file()"),
            Check("copy_content", f"assert read({copy_dst!r}) == {files[copy_src]!r}"),
            Check("original_kept", f"assert read({copy_src!r}) == {files[copy_src]!r}"),
            Check("renamed_content", f"assert read({new!r}) == {files[old]!r}"),
            Check("old_name_gone", f"assert not Path({old!r}).exists()"),
        ],
        files=files,
    )


def cleanup(rng: random.Random) -> Draft:
    """Delete the files with one extension from a directory, keep the rest, count what is left."""
    directory = rng.choice(NAMES)
    doomed_ext, kept_ext = distinct(rng, EXTENSIONS, 2)
    doomed_count = rng.randint(2, 6)
    kept_count = rng.randint(1, min(4, doomed_count))  # a no-op passes the kept checks: keep them a minority
    stems = distinct(rng, NAMES, doomed_count + kept_count)
    doomed = [f"/app/{directory}/{stem}.{doomed_ext}" for stem in stems[:doomed_count]]
    kept = [f"/app/{directory}/{stem}.{kept_ext}" for stem in stems[doomed_count:]]
    files = {path: _content(rng) for path in doomed + kept}
    checks = [Check(identifier("deleted", path.rsplit("/", 1)[1]), f"assert not Path({path!r}).exists()")
              for path in doomed]
    checks += [Check(identifier("kept", path.rsplit("/", 1)[1]), f"assert read({path!r}) == {files[path]!r}")
               for path in kept]
    checks.append(Check("count_written", f"assert number('/app/count.txt') == {kept_count}"))
    return Draft(
        instruction=(f"Delete every .{doomed_ext} file in /app/{directory}, then write the number of files "
                     f"left in /app/{directory} to /app/count.txt."),
        commands=[f"rm /app/{directory}/*.{doomed_ext}", f"ls /app/{directory} | wc -l > /app/count.txt"],
        checks=checks,
        files=files,
    )


def find_copy(rng: random.Random) -> Draft:
    """Copy the files with one extension into a new directory."""
    source, target = distinct(rng, NAMES, 2)
    wanted_ext, other_ext = distinct(rng, EXTENSIONS, 2)
    wanted_count, other_count = rng.randint(1, 5), rng.randint(1, 3)
    stems = distinct(rng, NAMES, wanted_count + other_count)
    wanted = {stem: f"/app/{source}/{stem}.{wanted_ext}" for stem in stems[:wanted_count]}
    others = [f"/app/{source}/{stem}.{other_ext}" for stem in stems[wanted_count:]]
    files = {path: _content(rng) for path in [*wanted.values(), *others]}
    checks = [Check("target_is_directory", f"assert Path({f'/app/{target}'!r}).is_dir()")]
    for stem, path in wanted.items():
        copy = f"/app/{target}/{stem}.{wanted_ext}"
        checks.append(Check(identifier("copied", stem, wanted_ext), f"assert read({copy!r}) == {files[path]!r}"))
    checks += [
        Check("only_wanted_copied", f"assert sorted(os.listdir({f'/app/{target}'!r})) == "
                                    f"{sorted(f'{stem}.{wanted_ext}' for stem in wanted)!r}"),
        Check("sources_kept", f"assert all(Path(p).is_file() for p in {sorted(files)!r})"),
    ]
    return Draft(
        instruction=f"Copy every .{wanted_ext} file from /app/{source} into the new directory /app/{target}.",
        commands=[f"mkdir /app/{target}", f"cp /app/{source}/*.{wanted_ext} /app/{target}/"],
        checks=checks,
        files=files,
    )


def permissions(rng: random.Random) -> Draft:
    """Make a script executable and a secret private; a bystander keeps its mode."""
    script, secret, bystander = distinct(rng, NAMES, 3)
    script_path, secret_path, other_path = f"/app/{script}.sh", f"/app/{secret}.txt", f"/app/{bystander}.txt"
    files = {script_path: f"#!/bin/sh\necho {rng.choice(NAMES)}\n", secret_path: _content(rng),
             other_path: _content(rng)}
    mode = "mode = stat.S_IMODE(os.stat({!r}).st_mode)\n"
    return Draft(
        instruction=f"Make {script_path} executable and make {secret_path} readable and writable only by its owner.",
        commands=[f"chmod +x {script_path}", f"chmod 600 {secret_path}"],
        checks=[
            Check("script_executable", f"assert os.stat({script_path!r}).st_mode & stat.S_IXUSR"),
            Check("secret_private", mode.format(secret_path) + "assert mode & 0o077 == 0"),
            Check("secret_mode_600", mode.format(secret_path) + "assert mode == 0o600"),
            Check("contents_unchanged", f"assert {{p: read(p) for p in {sorted(files)!r}}} == {files!r}"),
            Check("bystander_mode_kept", mode.format(other_path) + "assert mode == 0o644"),
        ],
        files=files,
    )


FAMILIES = (
    Family("mkdir_move", "files", mkdir_move),
    Family("copy_rename", "files", copy_rename),
    Family("cleanup", "files", cleanup),
    Family("find_copy", "search", find_copy),
    Family("permissions", "permissions", permissions),
)
