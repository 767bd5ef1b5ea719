import os
import subprocess
from pathlib import Path

EXPECTED = ["east 100", "north 150", "south 50", "west 60"]


def lines():
    return Path("/app/report.txt").read_text().splitlines()


def test_report_exists():
    assert Path("/app/report.txt").is_file()


def test_report_has_every_region():
    assert sorted(line.split()[0] for line in lines()) == ["east", "north", "south", "west"]


def test_report_totals():
    assert sorted(lines()) == EXPECTED


def test_report_sorted():
    assert lines() == EXPECTED


def test_data_untouched():
    assert Path("/data/sales.csv").read_text().count("\n") == 7


def test_check_script_says_ok():
    result = subprocess.run(["/opt/report/check.sh"], capture_output=True, text=True,
                            env={**os.environ, "REPORT_PATH": "/app/report.txt"})
    assert result.stdout.strip() == "OK"


def test_check_output_saved():
    assert Path("/app/check.txt").read_text().strip() == "OK"
