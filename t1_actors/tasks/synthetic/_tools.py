"""Families of tool work: tar archives, small scripts, git."""

from __future__ import annotations

import gzip
import io
import random
import tarfile

from t1_actors.tasks.synthetic._draft import (
    NAMES,
    WORDS,
    Check,
    Draft,
    Family,
    distinct,
    identifier,
    lines_of_words,
    text,
)

GIT_IDENTITY = {  # git refuses to commit without an identity; the task's environment gives one
    "GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@example.com",
    "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@example.com",
}


def _member_checks(archive_dir: str, members: dict[str, str]) -> list[Check]:
    return [Check(identifier("member", name), f"assert read({f'{archive_dir}/{name}'!r}) == {body!r}")
            for name, body in members.items()]


def archive_pack(rng: random.Random) -> Draft:
    """Pack a directory into a .tar.gz, then remove the directory.

    Members may be stored as ``D/x.txt``, ``./D/x.txt`` or ``app/D/x.txt`` (tar of the absolute path):
    the checks find each file by its last two path parts, so every usual tar invocation is right.
    """
    directory, archive_name, *stems = distinct(rng, NAMES, 2 + rng.randint(2, 8))
    members = {f"{stem}.txt": text(lines_of_words(rng, rng.randint(1, 3))) for stem in stems}
    archive = f"/app/{archive_name}.tar.gz"
    expected = sorted(f"{directory}/{name}" for name in members)
    checks = [
        Check("archive_exists", f"assert Path({archive!r}).is_file()"),
        Check("archive_is_gzip_tar", f"assert tarfile.is_tarfile({archive!r})\n"
                                     f"assert open({archive!r}, 'rb').read(2) == b'\\x1f\\x8b'"),
    ]
    for name, body in members.items():
        member = f"{directory}/{name}"
        checks.append(Check(identifier("packed", name), f"assert tar_files({archive!r})[{member!r}] == {body!r}"))
    checks += [
        Check("nothing_else_packed", f"assert sorted(tar_files({archive!r})) == {expected!r}"),
        Check("directory_removed", f"assert not Path({f'/app/{directory}'!r}).exists()"),
    ]
    return Draft(
        instruction=f"Pack the directory /app/{directory} into {archive}, then delete /app/{directory}.",
        commands=[f"tar -czf {archive} /app/{directory}", f"rm -r /app/{directory}"],
        checks=checks,
        files={f"/app/{directory}/{name}": body for name, body in members.items()},
    )


def tar_gz(members: dict[str, str]) -> bytes:
    """A reproducible .tar.gz of ``members`` (fixed mtimes, owner and order), so tasks are byte-stable."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted(members):
            data = members[name].encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o644
            archive.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def archive_extract(rng: random.Random) -> Draft:
    """Extract a .tar.gz into a new directory: one check per member, up to 18 checks in all."""
    archive_name, directory, *stems = distinct(rng, NAMES, 2 + rng.randint(2, 16))
    members = {f"{stem}.txt": text(lines_of_words(rng, rng.randint(1, 3))) for stem in stems}
    archive, target = f"/app/{archive_name}.tar.gz", f"/app/{directory}"
    checks = [Check("target_is_directory", f"assert Path({target!r}).is_dir()")]
    checks += _member_checks(target, members)
    checks.append(Check("archive_kept", f"assert Path({archive!r}).is_file()"))
    return Draft(
        instruction=f"Extract the archive {archive} into the new directory {target}.",
        commands=[f"mkdir {target}", f"tar -xzf {archive} -C {target}"],
        checks=checks,
        files={archive: tar_gz(members)},
    )


def make_script(rng: random.Random) -> Draft:
    """Write a one-line script, make it executable, run it and keep its output."""
    script_name, directory, output_name = distinct(rng, NAMES, 3)
    stems = distinct(rng, NAMES, rng.randint(1, 4))
    script, out, listed = f"/app/{script_name}.sh", f"/app/{output_name}.txt", f"/app/{directory}"
    files = {f"{listed}/{stem}.txt": f"{rng.choice(WORDS)}\n" for stem in stems}
    listing = sorted(f"{stem}.txt" for stem in stems)
    return Draft(
        instruction=(f"Create the script {script} that runs ls {listed}, make it executable, "
                     f"then run it and save its output to {out}."),
        commands=[f"echo 'ls {listed}' > {script}", f"chmod +x {script}", f"{script} > {out}"],
        checks=[
            Check("script_exists", f"assert Path({script!r}).is_file()"),
            Check("script_executable", f"assert os.stat({script!r}).st_mode & stat.S_IXUSR"),
            Check("script_lists_directory", (
                f"result = subprocess.run(['sh', {script!r}], capture_output=True, text=True, timeout=10)\n"
                f"assert result.stdout.split() == {listing!r}")),
            Check("output_saved", f"assert read({out!r}).split() == {listing!r}"),
        ],
        files=files,
    )


def git_commit(rng: random.Random) -> Draft:
    """Make a directory a git repository and commit its files with a given message."""
    directory, *stems = distinct(rng, NAMES, 1 + rng.randint(1, 5))
    message = rng.choice(WORDS)
    repo = f"/app/{directory}"
    files = {f"{repo}/{stem}.txt": text(lines_of_words(rng, rng.randint(1, 2))) for stem in stems}
    checks = [
        Check("repository_created", f"assert Path({f'{repo}/.git'!r}).is_dir()"),
        Check("commit_exists", f"assert git({repo!r}, 'rev-parse', '--verify', 'HEAD').returncode == 0"),
        Check("commit_message", f"assert git({repo!r}, 'log', '-1', '--format=%s').stdout.strip() == {message!r}"),
    ]
    for path in files:
        name = path.rsplit("/", 1)[1]
        checks.append(Check(identifier("committed", name),
                            f"assert {name!r} in git({repo!r}, 'ls-tree', '--name-only', 'HEAD').stdout.split()"))
    checks.append(Check("working_tree_clean", f"result = git({repo!r}, 'status', '--porcelain')\n"
                                              f"assert result.returncode == 0 and result.stdout == ''"))
    return Draft(
        instruction=f"Make /app/{directory} a git repository and commit all its files with the message '{message}'.",
        commands=[f"git init -q {repo}", f"git -C {repo} add .", f"git -C {repo} commit -qm '{message}'"],
        checks=checks,
        files=files,
        env=dict(GIT_IDENTITY),
    )


FAMILIES = (
    Family("archive_pack", "archives", archive_pack),
    Family("archive_extract", "archives", archive_extract),
    Family("make_script", "scripts", make_script),
    Family("git_commit", "git", git_commit, needs=("git",)),
)
