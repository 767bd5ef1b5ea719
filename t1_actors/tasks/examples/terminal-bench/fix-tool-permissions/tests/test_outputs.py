import os
import stat
from pathlib import Path


def test_greet_is_executable_by_everyone():
    mode = os.stat("/usr/local/bin/greet").st_mode
    assert mode & stat.S_IXUSR and mode & stat.S_IXGRP and mode & stat.S_IXOTH


def test_greet_is_readable_by_everyone():
    assert os.stat("/usr/local/bin/greet").st_mode & stat.S_IROTH


def test_greeting_saved():
    assert Path("/app/greeting.txt").read_text().strip() == "hello, terminal"
