import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from expected import LOGS

ARCHIVE = "/app/logs.tar.gz"


def test_archive_is_gzip_tar():
    assert tarfile.is_tarfile(ARCHIVE)


def test_archive_holds_the_logs():
    with tarfile.open(ARCHIVE) as archive:
        names = sorted(m.name.removeprefix("./") for m in archive.getmembers() if m.isfile())
    assert names == sorted(LOGS)


def test_archived_contents():
    with tarfile.open(ARCHIVE) as archive:
        for member in archive.getmembers():
            if member.isfile():
                assert archive.extractfile(member).read().decode() == LOGS[member.name.removeprefix("./")]


def test_logs_deleted():
    assert not any(Path("/var/log/app", name).exists() for name in LOGS)


def test_readme_kept():
    assert Path("/var/log/app/README").read_text() == "keep me\n"
