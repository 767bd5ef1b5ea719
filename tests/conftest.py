"""Fixtures shared across test modules."""

from __future__ import annotations

import os
import uuid

import pytest

S3_BUCKET = "t1-tests"


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
