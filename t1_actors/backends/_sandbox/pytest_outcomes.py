"""A pytest plugin that reports each test's outcome, as pytest decided it, as JSON lines on a file
descriptor the verifier holds (no file in the workspace, nothing scraped from text output).

Outcomes: passed, failed, error (setup/teardown/collection), skipped, xfailed, xpassed. Only ``passed``
earns a point. Lines are written as each test finishes, so a run killed at its timeout keeps what it had,
and a report rewritten after it was logged cannot change what was written.

Forgery from inside pytest's process (issue 34): code that the tests import runs in this process and can
patch pytest's reporting. The recorder cannot stop that, but it makes the known ways loud:

* **Machinery fingerprint.** When collection starts (before any test module or the agent's code is
  imported; the recorder, registered last, is called first) it holds every module-level object and every
  class attribute (with its functions' ``__code__`` and defaults) of pytest's reporting and hook-calling
  modules (``WATCHED_MODULES``: the reports, the runner, the terminal reporter, skipping, the hook caller)
  and of this module. Before each ``passed`` it writes (no other outcome earns a point), and once more at
  session finish, it compares them by identity: a rebinding, a ``__code__`` swap, a deletion or a new callable is a
  ``pytest_altered:<module>.<name>`` record.
* **Hook registry.** When collection starts it holds every hook's implementations (plugin name, function);
  one added by the end of the session is ``hook_added:<hook>:<plugin>``, one removed ``hook_removed:...`` (a
  conftest among the pristine tests under ``tests_root`` is the only plugin allowed to register meanwhile).
* **Reports.** Each logged report's class must be the ``TestReport`` fingerprinted, and its (nodeid, when,
  outcome, xfail) is kept as logged: a report whose fields differ at ``seal`` is
  ``report_rewritten:<nodeid>``. Outcomes are read from the report's ``__dict__``, not its properties.

* **Each passed report, as made.** The recorder wraps ``pytest_runtest_makereport`` (outermost of the hooks
  registered before collection); a report that comes out plain ``passed`` is made again from the same call
  by the ``TestReport.from_item_and_call`` fingerprinted, and must say passed too, or it is
  ``report_forged:<nodeid>`` (a factory patched for one report and put back before the next check).
  pytest's own wrappers never turn another outcome into a plain pass (xfail handling sets ``wasxfail``).
* **The stream.** The recorder numbers its lines 0, 1, 2, ... (``n``); a line out of that sequence (written
  to the inherited fd by other code, or a line of the recorder's lost) is ``outcome_stream_forged``.

Each finding is a ``{"tampered": kind}`` line (once per kind); ``parse_outcomes`` returns them, and the
verifier flags the trial and scores it 0 (``FORGERY_KINDS``). ``seal`` ends the stream with
``{"sealed": true}``; a stream without it ended before the final check (a timeout, a crash, an
``os._exit``), which on its own is not a flag: every outcome written had passed the per-report check.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import types
from typing import Any

WATCHED_MODULES = ("_pytest.reports", "_pytest.runner", "_pytest.terminal", "_pytest.skipping", "_pytest.main",
                   "_pytest.python", "_pytest.outcomes", "pluggy._callers", "pluggy._hooks", "pluggy._manager",
                   "pluggy._result", __name__)
FORGERY_KINDS = ("pytest_altered", "hook_added", "hook_removed", "report_rewritten", "report_class",
                 "report_forged", "outcome_stream_forged")
# pluggy's hookimpl options, set by hand: this module must not import pytest (the verifier's host side imports
# it, where pytest is only a dev extra). A new-style wrapper, called before every other wrapper registered earlier.
_OUTER_WRAPPER = {"wrapper": True, "hookwrapper": False, "optionalhook": False, "tryfirst": True, "trylast": False,
                  "specname": None}
_NUMBERED = ("collected", "test", "tampered", "sealed")  # the recorder's records, numbered 0, 1, 2, ... in ``n``


def is_forgery(flag: str) -> bool:
    """True for a flag saying the pytest process's reporting was altered: its outcomes are not evidence."""
    return flag.split(":", 1)[0] in FORGERY_KINDS


def _parts(value: Any) -> tuple:
    """The objects whose identity stands for ``value``: itself, and for functions (also inside classmethod,
    staticmethod, property) their code, defaults and keyword defaults."""
    functions = [value]
    if isinstance(value, (classmethod, staticmethod)):
        functions.append(value.__func__)
    elif isinstance(value, property):
        functions += [value.fget, value.fset, value.fdel]
    parts: list[Any] = [value]
    for function in functions:
        if isinstance(function, types.FunctionType):
            parts += [function, function.__code__, function.__defaults__, function.__kwdefaults__]
    return tuple(parts)


def _fingerprint() -> dict[str, tuple]:
    """name -> identity parts of every watched module's globals and its own classes' attributes."""
    found: dict[str, tuple] = {}
    for module_name in WATCHED_MODULES:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        for name, value in list(vars(module).items()):
            found[f"{module_name}.{name}"] = _parts(value)
            if isinstance(value, type) and value.__module__ == module_name:
                for attr, member in list(vars(value).items()):
                    if attr != "__dict__" and attr != "__weakref__":
                        found[f"{module_name}.{name}.{attr}"] = _parts(member)
    return found


def _altered(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """Names rebound, deleted, or new with a callable or descriptor value (pytest sets a few plain data
    attributes on its classes lazily, e.g. a warning's shown-once switch; those are not flagged)."""
    changed = [name for name in before if name not in after or any(
        a is not b for a, b in zip(before[name], after[name], strict=True))]
    return changed + [name for name in after if name not in before and _behaves(after[name][0])]


def _behaves(value: Any) -> bool:
    return callable(value) or hasattr(type(value), "__get__") or isinstance(value, types.ModuleType)


class OutcomeReporter:
    def __init__(self, fd: int, tests_root: str | None = None):
        self.fd = fd
        self.tests_root = None if tests_root is None else tests_root.rstrip("/") + "/"
        self._machinery: dict[str, tuple] = {}
        self._report_class = importlib.import_module("_pytest.reports").TestReport
        self._hooks: dict[str, list[tuple[str, Any]]] | None = None
        self._pluginmanager: Any = None
        self._logged: list[tuple[Any, tuple]] = []
        self._said: set[str] = set()
        self._hooks_checked = False
        self._n = 0
        self._factory: Any = None

    def _emit(self, **record) -> None:
        data = (json.dumps({**record, "n": self._n}) + "\n").encode()
        self._n += 1
        while data:
            data = data[os.write(self.fd, data):]

    def _tampered(self, kind: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            self._emit(tampered=kind)

    # ------------------------------------------------------------------------- the checks

    def _hook_table(self) -> dict[str, list[tuple[str, Any]]]:
        hook = self._pluginmanager.hook
        return {name: [(impl.plugin_name, impl.function) for impl in caller.get_hookimpls()]
                for name, caller in list(vars(hook).items()) if hasattr(caller, "get_hookimpls")}

    def _pristine(self, plugin_name: str) -> bool:
        plugin = self._pluginmanager.get_plugin(plugin_name)
        path = getattr(plugin, "__file__", None)
        return (isinstance(plugin, types.ModuleType) and self.tests_root is not None and isinstance(path, str)
                and os.path.realpath(path).startswith(self.tests_root))

    def check(self) -> None:
        """Compare pytest's reporting machinery and hook registry with what they were before collection."""
        if self._hooks is None:  # collection has not started
            return
        for name in _altered(self._machinery, _fingerprint()):
            self._tampered(f"pytest_altered:{name}")
        now = self._hook_table()
        for name in sorted(set(self._hooks) | set(now)):
            before, after = self._hooks.get(name, []), now.get(name, [])
            for plugin_name, function in after:
                if not any(function is f for _, f in before) and not self._pristine(plugin_name):
                    self._tampered(f"hook_added:{name}:{plugin_name}")
            for plugin_name, function in before:
                if not any(function is f for _, f in after):
                    self._tampered(f"hook_removed:{name}:{plugin_name}")

    def seal(self) -> None:
        """The final check, after pytest returns: every logged report as it was logged, and the session-finish
        check (machinery, hooks) having run. Ends the stream with ``{"sealed": true}``."""
        # the machinery and hooks were checked at session finish: pytest's cleanup has undone its own
        # patches and unregistered plugins by now
        if self._hooks is not None and not self._hooks_checked:
            self._tampered("hook_removed:pytest_sessionfinish:t1-outcomes")
        for report, logged in self._logged:
            fields = vars(report)
            if (report.nodeid, fields.get("when"), fields.get("outcome"), "wasxfail" in fields) != logged:
                self._tampered(f"report_rewritten:{logged[0]}")
        self._emit(sealed=True)

    # ------------------------------------------------------------------------- the hooks

    def pytest_collection(self, session) -> None:
        """Before any test module (or what it imports) is imported, after pytest's own configure-time
        patches (its legacypath plugin adds properties to its classes)."""
        self._machinery = _fingerprint()
        self._factory = self._report_class.from_item_and_call
        self._pluginmanager = session.config.pluginmanager
        self._hooks = self._hook_table()

    def pytest_runtest_makereport(self, item, call):
        report = yield
        fields = vars(report)
        if self._factory is not None and fields.get("outcome") == "passed" and "wasxfail" not in fields:
            if vars(self._factory(item, call)).get("outcome") != "passed":
                self._tampered(f"report_forged:{report.nodeid}")
        return report

    pytest_runtest_makereport.pytest_impl = _OUTER_WRAPPER  # type: ignore[attr-defined]

    def pytest_sessionfinish(self, session) -> None:
        self.check()
        self._hooks_checked = True

    def pytest_collection_finish(self, session) -> None:
        self._emit(collected=[item.nodeid for item in session.items])

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self._emit(test=report.nodeid or "<collection>", outcome="error", detail=str(report.longrepr)[-400:])

    def pytest_runtest_logreport(self, report) -> None:
        if type(report) is not self._report_class:
            self._tampered(f"report_class:{type(report).__module__}.{type(report).__qualname__}")
        fields = vars(report)
        nodeid, when, result, xfail = report.nodeid, fields.get("when"), fields.get("outcome"), "wasxfail" in fields
        self._logged.append((report, (nodeid, when, result, xfail)))
        if when == "call":
            if result == "passed":
                outcome = "xpassed" if xfail else "passed"
            elif result == "skipped":
                outcome = "xfailed" if xfail else "skipped"
            else:
                outcome = "failed"
        elif result == "failed":  # setup or teardown broke: an error, whatever the call did
            outcome = "error"
        elif when == "setup" and result == "skipped":
            outcome = "xfailed" if xfail else "skipped"
        else:
            return
        if outcome == "passed":  # the only outcome that earns a point is checked before it is written (~2 ms)
            self.check()
        self._emit(test=nodeid, outcome=outcome)


def parse_outcomes(text: str) -> tuple[dict[str, str], list[str], str | None, list[str]]:
    """(test -> outcome, collected node ids, infra error, tamper findings) from the reporter's JSON lines;
    bad lines skipped."""
    tests: dict[str, str] = {}
    collected: list[str] = []
    infra_error = None
    tampered: list[str] = []
    numbered = 0
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict):
            continue
        if any(key in record for key in _NUMBERED):
            if record.get("n") != numbered and "outcome_stream_forged" not in tampered:
                tampered.append("outcome_stream_forged")  # a line the recorder did not write, or one dropped
            numbered += 1
        if "collected" in record:
            collected = [str(c) for c in record["collected"]]
        elif "test" in record and "outcome" in record:
            tests[str(record["test"])] = str(record["outcome"])
        elif "infra_error" in record:
            infra_error = str(record["infra_error"])
        elif "tampered" in record and str(record["tampered"]) not in tampered:
            tampered.append(str(record["tampered"]))
    return tests, collected, infra_error, tampered


# Loaded by ``-p t1_outcomes_plugin`` where the reporter cannot get an fd (a remote sandbox): it appends
# to the file named by $T1_OUTCOMES instead, and seals the stream at the session's end.
FILE_PLUGIN = '''\
import os
import pytest
from t1_pytest_outcomes import OutcomeReporter

def pytest_configure(config):
    fd = os.open(os.environ["T1_OUTCOMES"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    config.pluginmanager.register(OutcomeReporter(fd, "/tests"), "t1-outcomes")

@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    reporter = config.pluginmanager.get_plugin("t1-outcomes")
    if reporter is not None:
        reporter.seal()
'''
