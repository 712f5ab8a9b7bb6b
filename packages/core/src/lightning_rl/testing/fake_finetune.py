"""A fake OpenAI-compatible fine-tuning server: a real HTTP server on 127.0.0.1 with scripted job states.

``FakeFineTuningServer`` answers ``POST /v1/files``, ``POST /v1/fine_tuning/jobs``, ``GET
/v1/fine_tuning/jobs/{id}`` and ``POST /v1/fine_tuning/jobs/{id}/cancel`` the way the hosted APIs do
(OpenAI's object shapes and error bodies), so ``HostedSFT`` is tested over real HTTP without a
provider. Each job walks through ``states``, one per status read, then ends as ``outcome``:
``succeeded`` (with a ``fine_tuned_model``), ``failed`` (with ``error``), ``cancelled`` (by the
provider), or ``hang`` (stays ``running`` until cancelled, for Ctrl-C tests). It is a stdlib
``ThreadingHTTPServer`` in a daemon thread, so it works from sync and async tests alike::

    with FakeFineTuningServer(outcome="failed", error={"code": "invalid_file", "message": "line 3: ..."}) as api:
        HostedSFT(HostedSFTConfig(base_url=api.base_url, model="gpt-test")).fit(...)
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

__all__ = ["FakeFineTuningServer", "FakeJobOutcome", "FAKE_API_KEY"]

FakeJobOutcome = Literal["succeeded", "failed", "cancelled", "hang"]
FAKE_API_KEY = "sk-fake-finetune"
"""The key the fake accepts by default (anything else gets OpenAI's 401 body)."""


class FakeFineTuningServer:
    """The fake API; ``files``, ``jobs`` and ``requests`` record what clients did, for assertions.

    Args:
        outcome: How every job ends (see the module docstring).
        states: The statuses a job reports before it ends, one per read.
        error: The ``error`` object of a failed job (OpenAI shape: code, message, param).
        api_key: The bearer key requests must carry.
    """

    def __init__(
        self,
        *,
        outcome: FakeJobOutcome = "succeeded",
        states: tuple[str, ...] = ("validating_files", "queued", "running"),
        error: dict[str, Any] | None = None,
        api_key: str = FAKE_API_KEY,
    ) -> None:
        self.outcome = outcome
        self.states = states
        self.error = error or {
            "code": "invalid_training_file",
            "message": "the training file is invalid",
            "param": None,
        }
        self.api_key = api_key
        self.files: dict[str, bytes] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.cancelled = threading.Event()
        self.running = threading.Event()
        """Set once a job has reported ``running`` (a Ctrl-C test waits for it)."""
        self._reads: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` (what ``HostedSFTConfig.base_url`` takes)."""
        if self._server is None:
            raise RuntimeError("start the fake first: use it as a context manager")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeFineTuningServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  # quiet: tests read assertions
                return

            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # --- the API ---------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = h.path.split("?", 1)[0]
        with self._lock:
            self.requests.append((method, path))
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        if h.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _send(h, 401, _error("Incorrect API key provided.", "invalid_api_key"))
        parts = path.strip("/").split("/")
        if method == "POST" and parts == ["v1", "files"]:
            return self._upload(h, body)
        if method == "POST" and parts == ["v1", "fine_tuning", "jobs"]:
            return self._create(h, body)
        if len(parts) >= 4 and parts[:3] == ["v1", "fine_tuning", "jobs"]:
            job = self.jobs.get(parts[3])
            if job is None:
                return _send(h, 404, _error(f"No such fine-tuning job: {parts[3]}", "fine_tune_not_found"))
            if method == "GET" and len(parts) == 4:
                return _send(h, 200, self._advance(job))
            if method == "POST" and parts[4:] == ["cancel"]:
                return self._cancel(h, job)
        return _send(h, 404, _error(f"Unknown endpoint: {method} {path}", "not_found"))

    def _upload(self, h: BaseHTTPRequestHandler, body: bytes) -> None:
        head = f"Content-Type: {h.headers.get('Content-Type')}\r\n\r\n".encode()
        form = BytesParser(policy=HTTP).parsebytes(head + body)
        fields: dict[str, bytes] = {}
        for part in form.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            if isinstance(name, str) and isinstance(payload, bytes):
                fields[name] = payload
        if fields.get("purpose") != b"fine-tune":
            return _send(h, 400, _error("purpose must be 'fine-tune' for a training file.", "invalid_purpose"))
        content = fields.get("file")
        if not content:
            return _send(h, 400, _error("No file was uploaded.", "missing_file"))
        for n, line in enumerate(content.splitlines(), 1):
            try:
                json.loads(line)
            except ValueError:
                return _send(h, 400, _error(f"Invalid file format: line {n} is not JSON.", "invalid_file_format"))
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        with self._lock:
            self.files[file_id] = content
        return _send(
            h,
            200,
            {"id": file_id, "object": "file", "bytes": len(content), "purpose": "fine-tune", "status": "processed"},
        )

    def _create(self, h: BaseHTTPRequestHandler, body: bytes) -> None:
        try:
            request: dict[str, Any] = json.loads(body or b"{}")
        except ValueError:
            return _send(h, 400, _error("The request body is not JSON.", "invalid_json"))
        if request.get("training_file") not in self.files:
            message = f"invalid training_file: {request.get('training_file')}"
            return _send(h, 400, _error(message, "invalid_training_file", "training_file"))
        if not request.get("model"):
            return _send(h, 400, _error("you must provide a model parameter", "missing_model", "model"))
        job_id = f"ftjob-{uuid.uuid4().hex[:24]}"
        job: dict[str, Any] = {
            "id": job_id,
            "object": "fine_tuning.job",
            "created_at": int(time.time()),
            "model": request["model"],
            "training_file": request["training_file"],
            "status": self.states[0] if self.states else "queued",
            "fine_tuned_model": None,
            "error": None,
            "suffix": request.get("suffix"),
            "method": request.get("method"),
        }
        with self._lock:
            self.jobs[job_id] = job
            self._reads[job_id] = 0
        return _send(h, 200, job)

    def _advance(self, job: dict[str, Any]) -> dict[str, Any]:
        """One status read: the next scripted state, then the outcome (a hang stays ``running``)."""
        with self._lock:
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return dict(job)
            self._reads[job["id"]] += 1
            n = self._reads[job["id"]]
            if n < len(self.states):
                job["status"] = self.states[n]
            elif self.outcome == "hang":
                job["status"] = "running"
            elif self.outcome == "succeeded":
                job["status"] = "succeeded"
                suffix = f":{job['suffix']}" if job.get("suffix") else ""
                job["fine_tuned_model"] = f"ft:{job['model']}:lightning{suffix}:{job['id'][-8:]}"
            elif self.outcome == "failed":
                job["status"] = "failed"
                job["error"] = dict(self.error)
            else:
                job["status"] = "cancelled"
            if job["status"] == "running":
                self.running.set()
            return dict(job)

    def _cancel(self, h: BaseHTTPRequestHandler, job: dict[str, Any]) -> None:
        with self._lock:
            if job["status"] in ("succeeded", "failed", "cancelled"):
                message = f"Job {job['id']} has already {job['status']} and cannot be cancelled."
                return _send(h, 400, _error(message, "invalid_state"))
            job["status"] = "cancelled"
            self.cancelled.set()
            return _send(h, 200, dict(job))


def _error(message: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def _send(h: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)
