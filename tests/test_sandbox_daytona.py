"""The Daytona backend, driven through the real Daytona SDK against ``DaytonaApiStandIn``: a local HTTP
test double of the few Daytona API routes the SDK calls (it is NOT Daytona; the Daytona server cannot
run here). The stand-in executes commands for real in the local sandbox, honouring networkBlockAll."""

from __future__ import annotations

import email.parser
import email.policy
import json
import os
import re
import shlex
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from t1_actors.backends._sandbox import cgroups
from t1_actors.backends.daytona_sandbox import DaytonaSandboxBackend, DaytonaSandboxConfig
from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig, SandboxInfraError
from t1_actors.tasks.model import Environment, FileSpec, Limits, Task
from t1_actors.tasks.model import Tests as TaskTests

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or cgroups.available() is not None,
                                reason="the stand-in runs commands in the local sandbox (root, cgroups)")


class DaytonaApiStandIn:
    """Test double of the Daytona API (control plane + toolbox) for the SDK's sync client."""

    def __init__(self, local: LocalSandboxBackend):
        self.local = local
        self.sandboxes: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.created_bodies: list[dict] = []
        self.deleted: list[str] = []
        self.fail_next_exec = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for entry in self.sandboxes.values():
            entry["local"].close()

    def _dto(self, entry: dict, state: str = "started") -> dict:
        body = entry["body"]
        return {"id": entry["id"], "organizationId": "org-standin", "name": body.get("name") or entry["id"],
                "user": "root", "env": body.get("env") or {}, "labels": body.get("labels") or {}, "public": False,
                "networkBlockAll": bool(body.get("networkBlockAll")), "kvm": False, "target": "local",
                "cpu": body.get("cpu") or 1, "gpu": 0, "memory": body.get("memory") or 1, "disk": 3,
                "state": state, "toolboxProxyUrl": f"{self.url}/toolbox"}

    def _find(self, key: str) -> dict | None:
        return self.sandboxes.get(key) or next((e for e in self.sandboxes.values() if e["body"].get("name") == key), None)

    def _create(self, body: dict) -> dict:
        self.created_bodies.append(body)
        dockerfile = (body.get("buildInfo") or {}).get("dockerfileContent")
        task = Task(id="standin", family="standin", instruction="-", tests=TaskTests(files={"t.py": "x"}),
                    environment=Environment(dockerfile=dockerfile, workdir="/", env=body.get("env") or {}),
                    limits=Limits(memory_mb=512, max_output_bytes=1 << 20))
        sandbox_id = uuid.uuid4().hex[:12]
        entry = {"id": sandbox_id, "body": body, "local": self.local.open(task, f"daytona-{sandbox_id}")}
        self.sandboxes[sandbox_id] = entry
        return self._dto(entry)

    def _execute(self, entry: dict, body: dict) -> tuple[int, dict]:
        if self.fail_next_exec:
            self.fail_next_exec = False
            return 500, {"statusCode": 500, "message": "runner lost"}
        env = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (body.get("envs") or {}).items())
        cwd = f"cd {shlex.quote(body['cwd'])} && " if body.get("cwd") else ""
        result = entry["local"].exec(env + cwd + body["command"], timeout_s=float(body.get("timeout") or 60),
                                     network=not entry["body"].get("networkBlockAll"))
        code = 124 if result.timed_out else result.exit_code
        return 200, {"exitCode": code, "result": result.stdout + result.stderr}

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _reply(self, status: int, payload, content_type="application/json") -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_POST(self) -> None:
                standin.requests.append(("POST", self.path))
                raw = self._body()
                if self.path == "/sandbox":
                    return self._reply(200, standin._create(json.loads(raw)))
                match = re.fullmatch(r"/toolbox/(\w+)(/.*)", self.path)
                entry = standin._find(match.group(1)) if match else None
                if entry is None:
                    return self._reply(404, {"statusCode": 404, "message": f"no route {self.path}"})
                route = match.group(2)
                if route == "/process/execute":
                    return self._reply(*standin._execute(entry, json.loads(raw)))
                if route == "/files/bulk-upload":
                    return self._upload(entry, raw)
                if route == "/files/bulk-download":
                    return self._download(entry, json.loads(raw)["paths"])
                return self._reply(404, {"statusCode": 404, "message": f"no route {route}"})

            def _upload(self, entry: dict, raw: bytes) -> None:
                head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
                message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
                fields: dict[str, bytes] = {}
                for part in message.iter_parts():
                    fields[part.get_param("name", header="content-disposition")] = part.get_payload(decode=True)
                for key, value in fields.items():
                    if key.endswith(".path"):
                        data = fields[key[: -len(".path")] + ".file"]
                        path = value.decode()
                        entry["local"].exec(f"mkdir -p {shlex.quote(os.path.dirname(path))}")
                        entry["local"].write_file(path, data)
                self._reply(200, {})

            def _download(self, entry: dict, paths: list[str]) -> None:
                boundary = uuid.uuid4().hex
                parts = []
                for path in paths:
                    try:
                        data, name, kind = entry["local"].read_file(path), "file", "application/octet-stream"
                    except OSError as exc:
                        error = json.dumps({"message": str(exc), "statusCode": 404}).encode()
                        data, name, kind = error, "error", "application/json"
                    parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{path}\"\r\n"
                                 f"Content-Type: {kind}\r\n\r\n".encode() + data + b"\r\n")
                self._reply(200, b"".join(parts) + f"--{boundary}--\r\n".encode(),
                            f"multipart/form-data; boundary={boundary}")

            def do_GET(self) -> None:
                standin.requests.append(("GET", self.path))
                match = re.fullmatch(r"/sandbox/([\w.-]+)(/toolbox-proxy-url)?", self.path.split("?")[0])
                entry = standin._find(match.group(1)) if match else None
                if entry is None:
                    return self._reply(404, {"statusCode": 404, "message": f"sandbox not found: {self.path}"})
                if match.group(2):
                    return self._reply(200, {"url": f"{standin.url}/toolbox"})
                return self._reply(200, standin._dto(entry))

            def do_DELETE(self) -> None:
                standin.requests.append(("DELETE", self.path))
                match = re.fullmatch(r"/sandbox/([\w.-]+)", self.path.split("?")[0])
                entry = standin._find(match.group(1)) if match else None
                if entry is None:
                    return self._reply(404, {"statusCode": 404, "message": "sandbox not found"})
                entry["local"].close()
                standin.deleted.append(entry["id"])
                del standin.sandboxes[entry["id"]]
                return self._reply(200, standin._dto(entry, "destroyed"))

        return Handler


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    local = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(tmp_path_factory.mktemp("sandbox"))))
    standin = DaytonaApiStandIn(local)
    yield standin
    standin.close()
    local.close()


@pytest.fixture(scope="module")
def backend(standin):
    os.environ["T1_TEST_DAYTONA_KEY"] = "test-key"
    with pytest.warns(DeprecationWarning, match="Polling-only mode"):  # the stand-in has no event stream
        backend = DaytonaSandboxBackend(DaytonaSandboxConfig(api_url=standin.url, api_key_env="T1_TEST_DAYTONA_KEY",
                                                             state_by_polling=True))
    yield backend
    backend.close()


def make_task(**environment) -> Task:
    return Task(id="dt", family="test", instruction="x", tests=TaskTests(files={"test_a.py": "def test_a(): pass\n"}),
                environment=Environment(**environment), limits=Limits(max_output_bytes=1000))


def test_create_exec_files_and_delete(standin, backend):
    task = make_task(files={"/app/in.txt": FileSpec(content="hi\n", mode=0o600)}, setup=["echo set > /app/setup.txt"],
                     env={"GREETING": "hello"})
    with backend.open(task, "Trial_1") as sandbox:
        body = standin.created_bodies[-1]
        assert body["networkBlockAll"] is True and body["env"] == {"GREETING": "hello"}
        assert body["buildInfo"]["dockerfileContent"].startswith("FROM python:3.12-slim")
        result = sandbox.exec("pwd; cat in.txt setup.txt; stat -c %a in.txt; echo $GREETING")
        assert result.exit_code == 0 and result.stdout == "/app\nhi\nset\n600\nhello\n"
        assert sandbox.exec("exit 7").exit_code == 7
        sandbox.write_file("/app/out.bin", b"\x00\x01data", 0o755)
        assert sandbox.read_file("/app/out.bin") == b"\x00\x01data"
        remote_id = sandbox.remote.id
    assert remote_id in standin.deleted


def test_agent_turns_have_no_network(backend):
    with backend.open(make_task(), "net") as sandbox:
        result = sandbox.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"")
        assert result.exit_code != 0 and "unreachable" in result.stdout.lower()


def test_timeout_and_output_cap(backend):
    with backend.open(make_task(), "limits") as sandbox:
        slow = sandbox.exec("sleep 30", timeout_s=1)
        assert slow.timed_out and slow.exit_code == 124
        loud = sandbox.exec("head -c 5000 /dev/zero | tr '\\0' a")
        assert loud.stdout_truncated and len(loud.stdout) == 1000


def test_api_failure_is_an_infra_error_and_the_sandbox_is_still_deleted(standin, backend):
    sandbox = backend.open(make_task(), "failing")
    standin.fail_next_exec = True
    with pytest.raises(SandboxInfraError, match="Daytona exec failed"):
        sandbox.exec("true")
    sandbox.close()
    assert sandbox.remote.id in standin.deleted


def test_failed_setup_deletes_the_sandbox(standin, backend):
    before = set(standin.deleted)
    with pytest.raises(SandboxInfraError, match="setup command 0 exited 3"):
        backend.open(make_task(setup=["exit 3"]), "badsetup")
    assert len(set(standin.deleted) - before) == 1 and not standin.sandboxes


def test_missing_api_key_is_a_clear_error():
    with pytest.raises(SandboxInfraError, match=r"\$T1_NO_SUCH_KEY"):
        DaytonaSandboxBackend(DaytonaSandboxConfig(api_url="http://127.0.0.1:9", api_key_env="T1_NO_SUCH_KEY"))


def test_verification_inside_a_daytona_sandbox(standin, backend, tmp_path):
    from t1_actors.verify.engine import Verifier, VerifierConfig

    tests = ("import os\n\ndef test_answer():\n    assert open('/app/answer.txt').read().strip() == '42'\n\n"
             "def test_env():\n    assert os.environ['TEST_DIR'] == '/tests' and os.getcwd() == '/app'\n\n"
             "def test_impossible():\n    assert os.path.exists('/app/impossible')\n")
    task = Task(id="remote", family="test", instruction="x", tests=TaskTests(files={"test_outputs.py": tests}),
                environment=Environment(files={"/app/conftest_like.txt": FileSpec(content="fine")}))
    with Verifier(VerifierConfig(base_dir=str(tmp_path / "verifier"))) as verifier:
        with backend.open(task, "remote-honest") as sandbox:
            sandbox.exec("echo 42 > /app/answer.txt")
            attached = backend.attach(task, "remote-honest")
            honest = verifier.verify_in_sandbox(task, attached)
            attached.close()  # detaches: the owner's sandbox stays
            assert sandbox.exec("true").exit_code == 0
        with backend.open(task, "remote-cheat") as sandbox:
            sandbox.exec("echo 42 > /app/answer.txt; printf 'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\n"
                         "def pytest_runtest_makereport(item, call):\\n    o = yield\\n    o.get_result().outcome = "
                         "\"passed\"\\n' > /app/conftest.py")
            cheat = verifier.verify_in_sandbox(task, sandbox)
    assert honest.infra_error is None, honest.infra_error
    assert honest.tests == {"test_outputs.py::test_answer": "passed", "test_outputs.py::test_env": "passed",
                            "test_outputs.py::test_impossible": "failed"}
    assert honest.passed == 2 and honest.reward == 0.1 and honest.tamper_flags == []
    assert cheat.passed == 2 and "conftest_planted:/app/conftest.py" in cheat.tamper_flags
