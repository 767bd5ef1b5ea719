"""Dockerfile replay plans: parsing, substitution, COPY/ADD resolution, what is reported unhonoured."""

from __future__ import annotations

import pytest

from t1_actors.backends.dockerfile import (
    CopyStep,
    DockerfileError,
    RunStep,
    WorkdirStep,
    expand,
    parse_dockerfile,
    plan_dockerfile,
)


def test_continuations_comments_and_heredocs_are_parsed():
    text = ("# escape=\\\nFROM ubuntu:24.04\n# a comment\nRUN echo a && \\\n    # inside\n\n    echo b\n"
            "COPY <<-EOT /etc/x.conf\n\tindented\nEOT\nRUN cat <<'EOF' > /f\n$NOT_EXPANDED\nEOF\n")
    names = [(i.name, i.line) for i in parse_dockerfile(text)]
    assert names == [("FROM", 2), ("RUN", 4), ("COPY", 8), ("RUN", 11)]
    run, copy, heredoc_run = parse_dockerfile(text)[1:]
    assert run.args == "echo a && echo b"
    assert copy.heredocs == (("EOT", "indented\n", True),)
    assert heredoc_run.heredocs == (("EOF", "$NOT_EXPANDED\n", False),)
    assert heredoc_run.raw == "RUN cat <<'EOF' > /f\n$NOT_EXPANDED\nEOF"


def test_unclosed_heredoc_is_a_clear_error():
    with pytest.raises(DockerfileError, match="line 2: heredoc <<EOT is never closed"):
        parse_dockerfile("FROM x\nCOPY <<EOT /a\nbody\n")


@pytest.mark.parametrize("text,env,expected", [
    ("$A/${B}", {"A": "1", "B": "2"}, "1/2"),
    ("${MISSING:-dflt}", {}, "dflt"),
    ("${A:+set}", {"A": "x"}, "set"),
    ("${A:+set}", {}, ""),
    ("\\$A", {"A": "x"}, "$A"),
])
def test_variable_substitution(text, env, expected):
    assert expand(text, env) == expected


def test_plan_tracks_arg_env_workdir_and_shell():
    plan = plan_dockerfile(
        "ARG BASE=ubuntu\nFROM ${BASE}:24.04\nARG V=1\nENV A=x B=\"y z\" C=${V}\nENV LEGACY some words\n"
        "WORKDIR /srv\nWORKDIR app\nSHELL [\"/bin/bash\", \"-c\"]\nRUN echo $A\nRUN [\"echo\", \"exec\"]\n",
        None, build_args={"V": "7"})
    assert plan.base_images == ["ubuntu:24.04"]
    assert plan.env == {"A": "x", "B": "y z", "C": "7", "LEGACY": "some words"}
    assert plan.workdir == "/srv/app"
    workdirs = [s.path for s in plan.steps if isinstance(s, WorkdirStep)]
    runs = [s for s in plan.steps if isinstance(s, RunStep)]
    assert workdirs == ["/srv", "/srv/app"]
    assert runs[0].argv == ("/bin/bash", "-c", "echo $A") and runs[0].env["V"] == "7"
    assert runs[1].argv == ("echo", "exec")


def test_tbench_images_imply_app_workdir():
    assert plan_dockerfile("FROM ghcr.io/laude-institute/t-bench/python-3-13:20250620\n", None).workdir == "/app"
    assert plan_dockerfile("FROM python:3.13-slim\n", None).workdir == "/"


def test_copy_resolves_globs_dirs_and_relative_destinations(tmp_path):
    (tmp_path / "src").mkdir()
    for name in ("a.py", "b.py", "c.txt"):
        (tmp_path / "src" / name).write_text(name)
    plan = plan_dockerfile("FROM x\nWORKDIR /app\nCOPY src/*.py lib/\nCOPY src /opt/src\nCOPY --chmod=755 src/c.txt run\n",
                           tmp_path)
    globbed, directory, single = [s for s in plan.steps if isinstance(s, CopyStep)]
    assert [s.name for s in globbed.sources] == ["a.py", "b.py"] and globbed.dest == "/app/lib/"
    assert directory.dest_is_dir and directory.sources[0].host_path == str(tmp_path / "src")
    assert single.dest == "/app/run" and single.chmod == 0o755 and not single.dest_is_dir


def test_copy_errors_name_the_line_and_fix(tmp_path):
    with pytest.raises(DockerfileError, match="line 2: COPY source 'nope.txt' matches nothing"):
        plan_dockerfile("FROM x\nCOPY nope.txt /app/\n", tmp_path)
    with pytest.raises(DockerfileError, match="leaves the build context"):
        (tmp_path / "inner").mkdir()
        plan_dockerfile("FROM x\nCOPY ../../etc/passwd /app/\n", tmp_path / "inner")
    with pytest.raises(DockerfileError, match="unknown instruction 'FORM'"):
        plan_dockerfile("FORM x\n", tmp_path)


def test_unhonoured_instructions_are_reported_by_name(tmp_path):
    plan = plan_dockerfile("FROM a AS build\nRUN --mount=type=cache,target=/c true\nFROM b\nCOPY --from=build /out /out\n"
                           "ADD https://example.com/x.tgz /x\nUSER nobody\nEXPOSE 80\nVOLUME /data\nENTRYPOINT [\"x\"]\n"
                           "HEALTHCHECK CMD true\n", tmp_path)
    text = "\n".join(plan.unhonoured)
    for name in ("multi-stage FROM b", "RUN --mount", "ADD https://example.com/x.tgz", "USER nobody", "EXPOSE 80",
                 "VOLUME /data", "ENTRYPOINT", "HEALTHCHECK"):
        assert name in text
    copy = [s for s in plan.steps if isinstance(s, CopyStep)][0]
    assert copy.sources[0].root_path == "/out"


def test_run_heredoc_with_shebang_is_executed_as_a_file():
    plan = plan_dockerfile("FROM x\nRUN <<EOF\n#!/usr/bin/env python3\nprint('hi')\nEOF\n", None)
    (step,) = plan.steps
    assert step.stdin == b"#!/usr/bin/env python3\nprint('hi')\n" and "chmod +x" in step.argv[-1]


def test_profiles_are_keyed_on_the_base_image_alone():
    from t1_actors.backends._sandbox.profiles import profile_for

    assert profile_for("ghcr.io/laude-institute/t-bench/python-3-13:20250620").name == "t-bench-python"
    assert profile_for("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624").name == "t-bench"
    assert profile_for("python:3.12-slim").name == "python" and profile_for("docker.io/library/python:3").python
    assert profile_for("ubuntu:24.04").name == "debian-family" and profile_for("ubuntu:24.04").apt_from_host
    assert profile_for("public.ecr.aws/docker/library/python:3.11-slim").name == "python"
    assert profile_for("public.ecr.aws/docker/library/golang:1.22-bookworm").name == "debian-family"
    assert profile_for("alpine:3.20") is None and profile_for("myorg/ubuntu-tools:1") is None and profile_for(None) is None
    assert profile_for("python:3.13").env() == {"PIP_BREAK_SYSTEM_PACKAGES": "1"}


def test_env_lines_read_the_base_images_default_path():
    plan = plan_dockerfile('FROM gcc:13\nENV PATH="/root/.local/bin:${PATH}" GO=${GOPATH:-none}\n', None)
    assert plan.env == {"PATH": "/root/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                        "GO": "none"}
