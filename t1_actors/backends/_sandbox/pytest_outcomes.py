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
