"""Fixtures shared across test modules, and how the suite shares the machine.

The suite runs on two pytest-xdist workers (``-n 2 --dist loadgroup``, pyproject's addopts; ``-n 0`` runs it in
one process). A test module is one work unit, so its module-scoped fixtures (a campaign each) run once; the session's
``quick_campaign`` runs once for both workers (the first module to ask runs it, the others wait for it and read it),
so its readers spread over both workers instead of queueing on one. A test marked ``alone``
(and every ``netns`` test) runs with no other test at the same time: its assertions time heartbeats and outages,
and two namespace tests would share bridge names."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
import uuid
from pathlib import Path

import pytest

S3_BUCKET = "t1-tests"
# Set by .ci/run, which installs the SGLang venv while the other tests run: the file that receives
# .ci/setup-sglang's exit status once it is done (its output is beside it, "<file>.log").
SGLANG_SETUP_STATUS = "T1_SGLANG_SETUP_STATUS"
SGLANG_SETUP_TIMEOUT_S = 1800


# the work units that take longest go first (longest first balances two workers; pyproject keeps xdist from
# reordering them by their number of tests). From CI's --durations at 7dcb2c9: test_campaign runs the quick
# campaign (229 s) and ~400 s of its own, qwen3's campaign 756 s, slurm ~480 s and netns ~300 s (both alone)
FIRST = ("test_campaign", "test_campaign_qwen3", "test_slurm", "test_campaign_netns", "test_chaos",
         "test_campaign_sglang")


def pytest_configure(config):
    config.addinivalue_line("markers", "sglang_venv: needs the SGLang venv of .ci/setup-sglang")
    config.addinivalue_line("markers", "alone: runs with no other test at the same time (under pytest-xdist)")


def _work_unit(item) -> str:
    return item.module.__name__


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    """Each test joins its work unit (an ``xdist_group``: its module), the longest units first. While .ci/run
    installs the SGLang venv beside the tests, the tests that need it run last: the install overlaps everything
    else instead of delaying it."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_work_unit(item)))

    def order(item) -> tuple[bool, int]:
        unit = _work_unit(item)
        sglang = bool(os.environ.get(SGLANG_SETUP_STATUS)) and item.get_closest_marker("sglang_venv") is not None
        return sglang, FIRST.index(unit) if unit in FIRST else len(FIRST)

    items.sort(key=order)  # stable: the order within a unit is kept


class _MachineShare:
    """A readers-writer lock over the workers of one run: a test ``alone`` holds it exclusively (kept across
    consecutive ``alone`` tests of one worker), every other test shared. The gate keeps an ``alone`` test from
    waiting forever: once it asks, no new test starts on another worker."""

    def __init__(self) -> None:
        self.files: tuple | None = None  # (gate, lock) while this worker holds the lock
        self.exclusive = False

    def acquire(self, config, alone: bool) -> None:
        if self.files is not None and self.exclusive == alone:
            return  # held since the previous test, the same way
        self.release()
        run = getattr(config, "workerinput", {}).get("testrunuid")
        if run is None:  # one process: nothing runs beside this test
            return
        base = Path(tempfile.gettempdir()) / f"t1-pytest-{run}"
        gate, lock = open(f"{base}.gate", "a+"), open(f"{base}.lock", "a+")  # held across tests
        fcntl.flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        self.files, self.exclusive = (gate, lock), alone

    def release(self) -> None:
        if self.files is not None:
            for file in reversed(self.files):
                fcntl.flock(file, fcntl.LOCK_UN)
                file.close()
            self.files = None


_share = _MachineShare()


def _alone(item) -> bool:
    return item.get_closest_marker("alone") is not None or item.get_closest_marker("netns") is not None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of each test under the machine share (the wait is outside pytest-timeout's); a
    worker's exclusive hold lasts while its next test is ``alone`` too, a shared one only for the test."""
    _share.acquire(item.config, _alone(item))
    try:
        yield
    finally:
        if not (_share.exclusive and nextitem is not None and _alone(nextitem)):
            _share.release()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test that needs the SGLang venv waits, before its fixtures start a server, for .ci/run's install
    to finish, and fails with the install's output if it failed."""
    status = os.environ.get(SGLANG_SETUP_STATUS)
    if not status or item.get_closest_marker("sglang_venv") is None:
        return
    status_file = Path(status)
    deadline = time.monotonic() + SGLANG_SETUP_TIMEOUT_S
    while not status_file.exists():
        if time.monotonic() > deadline:
            pytest.fail(f".ci/setup-sglang has not finished after {SGLANG_SETUP_TIMEOUT_S} s ({status}.log)")
        time.sleep(1.0)
    code = status_file.read_text().strip()
    if code != "0":
        log = Path(f"{status}.log")
        tail = log.read_text()[-3000:] if log.exists() else "(no log)"
        pytest.fail(f".ci/setup-sglang failed (exit {code}):\n{tail}")


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3-API server (moto's server mode) on a loopback port, its bucket made, and the standard AWS
    variables pointing at it for this process and its children; the endpoint URL."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="t1-tests", AWS_SECRET_ACCESS_KEY="t1-tests",
                      AWS_DEFAULT_REGION="us-east-1")
    boto3.client("s3").create_bucket(Bucket=S3_BUCKET)
    yield endpoint
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def s3_url(s3_endpoint) -> str:
    """A fresh prefix in the test bucket."""
    return f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/log"


@pytest.fixture
def actor_config(tmp_path):
    """``make(*actors, **sections)``: a validated run config for actors under test, its run directory under
    ``tmp_path / "run"`` and a test key; each actor a ``{"name", "role", "actor_class"[, "options"]}`` dict."""
    from t1_actors.job.config import parse_config

    def make(*actors: dict, run_id: str = "actor-test", **sections):
        return parse_config({"run": {"id": run_id, "dir": str(tmp_path / "run"), "hmac_key": "k" * 32},
                             "actors": list(actors), **sections})

    return make


@pytest.fixture(scope="session")
def tiny_model():
    """``make(wide=False, **overrides)``: a tiny ``ModelConfig`` (tests/fixtures/models.py states the two
    shapes); module-level constants import ``fixtures.models.tiny_model_config`` itself."""
    from fixtures.models import tiny_model_config

    return tiny_model_config


@pytest.fixture(scope="session")
def quick_campaign(tmp_path_factory, worker_id):
    """The one micro ``--quick`` campaign of the test run (tests/fixtures/campaign.py, with its ``QUICK`` changes: a
    validation probe during RL), run on first use and read by every test that only needs a finished run: its
    summary, report, log, weights and tokenizer. Tests must not write into it; one that needs to change a run
    copies it first.

    Under pytest-xdist it is run once for all workers: the first to ask runs it under a file lock in the run's
    common temp directory, a later one waits for the lock and reads the result (its readers need not share a
    work unit)."""
    from fixtures.campaign import QUICK, CampaignRun, run_micro_campaign

    if worker_id == "master":  # one process (-n 0)
        return run_micro_campaign(tmp_path_factory.mktemp("quick-campaign"), **QUICK)
    shared = tmp_path_factory.getbasetemp().parent  # pytest-N/, above each worker's popen-gwK/
    result = shared / "quick-campaign.json"
    with open(shared / "quick-campaign.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            run = run_micro_campaign(tmp_path_factory.mktemp("quick-campaign"), **QUICK)
            result.write_text(json.dumps({**run._asdict(), "run_dir": str(run.run_dir), "tmp": str(run.tmp)}))
        done = json.loads(result.read_text())
    return CampaignRun(done["returncode"], done["output"], Path(done["run_dir"]), Path(done["tmp"]))


@pytest.fixture(scope="session")
def trial_world(tmp_path_factory):
    """Real rollout engines in this process, built once per session: 24 synthetic train tasks, a BPE tokenizer
    of 512 ids trained on them, a random ``WIDE`` policy of that vocabulary (seeded), a local sandbox backend
    and a verifier. Tests only sample from the policy; none trains it."""
    from fixtures.trials import open_trial_world

    with open_trial_world(tmp_path_factory.mktemp("trials")) as world:
        yield world
