"""A pytest plugin that reports each test's outcome, as pytest decided it, as JSON lines on a file
descriptor the verifier holds (no file in the workspace, nothing scraped from text output).

Outcomes: passed, failed, error (setup/teardown/collection), skipped, xfailed, xpassed. Only ``passed``
earns a point. Lines are written as each test finishes, so a run killed at its timeout keeps what it had.
"""

from __future__ import annotations

import json
import os


class OutcomeReporter:
    def __init__(self, fd: int):
        self.fd = fd

    def _emit(self, **record) -> None:
        data = (json.dumps(record) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]

    def pytest_collection_finish(self, session) -> None:
        self._emit(collected=[item.nodeid for item in session.items])

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self._emit(test=report.nodeid or "<collection>", outcome="error", detail=str(report.longrepr)[-400:])

    def pytest_runtest_logreport(self, report) -> None:
        xfail = hasattr(report, "wasxfail")
        if report.when == "call":
            if report.passed:
                outcome = "xpassed" if xfail else "passed"
            elif report.skipped:
                outcome = "xfailed" if xfail else "skipped"
            else:
                outcome = "failed"
        elif report.failed:  # setup or teardown broke: an error, whatever the call did
            outcome = "error"
        elif report.when == "setup" and report.skipped:
            outcome = "xfailed" if xfail else "skipped"
        else:
            return
        self._emit(test=report.nodeid, outcome=outcome)


def parse_outcomes(text: str) -> tuple[dict[str, str], list[str], str | None]:
    """(test -> outcome, collected node ids, infra error) from the reporter's JSON lines; bad lines skipped."""
    tests: dict[str, str] = {}
    collected: list[str] = []
    infra_error = None
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict):
            continue
        if "collected" in record:
            collected = [str(c) for c in record["collected"]]
        elif "test" in record and "outcome" in record:
            tests[str(record["test"])] = str(record["outcome"])
        elif "infra_error" in record:
            infra_error = str(record["infra_error"])
    return tests, collected, infra_error


# Loaded by ``-p t1_outcomes_plugin`` where the reporter cannot get an fd (a remote sandbox): it appends
# to the file named by $T1_OUTCOMES instead.
FILE_PLUGIN = '''\
import os
from t1_pytest_outcomes import OutcomeReporter

def pytest_configure(config):
    fd = os.open(os.environ["T1_OUTCOMES"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    config.pluginmanager.register(OutcomeReporter(fd), "t1-outcomes")
'''
