"""TEST DOUBLE: a local HTTP stand-in for an SGLang server, backed by the torch MoE policy.

The SGLang client runs against the real server in tests/test_sglang_real.py; this small server, which
speaks the documented fields of SGLang's native API (``/generate`` with ``input_ids``,
``sampling_params``, ``return_logprob``, ``return_routed_experts``, ``routed_experts_start_len``;
``/abort_request``; ``/update_weights_from_disk``), stays for fast wire-handling tests and the fault
cases a real server cannot be made to produce. It is not SGLang and does not pretend to batch like it.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from t1_actors.policy import MoEPolicy
from t1_actors.policy.sampling import SamplingParams, generate


class SGLangStandIn:
    def __init__(self, policy: MoEPolicy, weight_version: str = "0", port: int = 0):
        """``port``: 0 for a free one; an earlier stand-in's to come back on its URL, as a restarted server does."""
        self.policy = policy
        self.weight_version = weight_version
        self.aborted: set[str] = set()
        self.progress: dict[str, threading.Event] = {}  # rid -> set once a few tokens are out
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        host, port = self._server.server_address
        return f"http://{host}:{port}"

    def __enter__(self) -> SGLangStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def started(self, rid: str) -> threading.Event:
        with self._lock:
            return self.progress.setdefault(rid, threading.Event())

    # -- endpoints ------------------------------------------------------------------------------
    def generate(self, body: dict) -> tuple[int, dict]:
        self.requests.append(body)
        rid, ids = body["rid"], body["input_ids"]
        sp = body["sampling_params"]
        params = SamplingParams(max_new_tokens=sp.get("max_new_tokens", 128), temperature=sp.get("temperature", 1.0),
                                top_p=sp.get("top_p", 1.0), stop_ids=tuple(sp.get("stop_token_ids") or ()),
                                seed=sp.get("sampling_seed"))
        polls = [0]
        started = self.started(rid)

        def should_stop() -> bool:
            polls[0] += 1
            if polls[0] > 3:
                started.set()
            return rid in self.aborted

        with self._lock:
            policy, version = self.policy, self.weight_version
        g = generate(policy, [ids], params, capture_routing=bool(body.get("return_routed_experts")),
                     should_stop=should_stop)[0]
        reason = {"stop": {"type": "stop", "matched": int(g.output_ids[-1]) if len(g.output_ids) else None},
                  "length": {"type": "length", "length": len(g.output_ids)},
                  "cancelled": {"type": "abort", "message": "Abort request"}}[g.finish_reason]
        meta = {"id": rid, "finish_reason": reason, "prompt_tokens": len(ids), "completion_tokens": len(g.output_ids),
                "output_token_logprobs": [[float(lp), int(t), None] for lp, t in zip(g.logprobs, g.output_ids)],
                "weight_version": version}
        if body.get("return_routed_experts") and g.routing is not None:
            start = int(body.get("routed_experts_start_len", 0))
            meta["routed_experts"] = base64.b64encode(g.routing[start:].astype("<i4").tobytes()).decode()
        return 200, {"text": "", "output_ids": g.output_ids.tolist(), "meta_info": meta}

    def abort(self, body: dict) -> tuple[int, dict]:
        self.aborted.add(body["rid"])
        return 200, {}

    def update_weights(self, body: dict) -> tuple[int, dict]:
        try:
            policy = MoEPolicy.load(body["model_path"]).eval()
        except Exception as exc:  # SGLang answers success=false with a message
            return 200, {"success": False, "message": f"Failed to update weights: {exc}"}
        with self._lock:
            self.policy, self.weight_version = policy, body.get("weight_version") or self.weight_version
        return 200, {"success": True, "message": "Succeeded to update model weights."}

    def _handler(self):
        standin = self
        routes = {"/generate": standin.generate, "/abort_request": standin.abort,
                  "/update_weights_from_disk": standin.update_weights}

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # http.server API
                route = routes.get(self.path)
                if route is None:
                    status, reply = 404, {"error": f"no route {self.path}"}
                else:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    status, reply = route(body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep test output quiet
                pass

        return Handler


def decode_routing(encoded: str, layers: int, top_k: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(encoded), dtype="<i4").reshape(-1, layers, top_k)
