"""SFT through a hosted fine-tuning API: export, upload, train there, publish the new model.

OpenAI, Azure OpenAI, Together and others share one API: ``POST /v1/files`` (purpose
``fine-tune``) takes the training file, ``POST /v1/fine_tuning/jobs`` starts a job on it, ``GET
/v1/fine_tuning/jobs/{id}`` reports its status (``validating_files``, ``queued``, ``running``, then
``succeeded``, ``failed`` or ``cancelled``) and ``POST .../cancel`` stops it. ``HostedSFT`` drives it
for a user with no GPU:

1. export the store's selected rollouts as OpenAI chat JSONL (validated before it is written);
2. upload it, create the job, and poll with a growing interval (jobs take minutes to hours, and
   a tight loop would only spend the provider's rate limit);
3. on success, publish the fine-tuned model's name as a new resources version of the store, the
   previous version's endpoint settings, prompts and extras kept, so the next rollouts call it;
4. on Ctrl-C (or task cancellation) cancel the job before re-raising: a job left running is billed;
5. on failure raise ``HostedFineTuningError`` quoting the API's own message (and code).

The API key is read from the environment (``api_key_env``) and never written to the store: the
published resource keeps the previous version's ``api_key`` field (agents of a hosted model get
their key from their own environment).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx

from lightning_rl.errors import LightningError, NotFoundError
from lightning_rl.export._export import ExportReport, export_sft
from lightning_rl.export._formats import SftUnit
from lightning_rl.export._select import Selection
from lightning_rl.store.base import LightningStore
from lightning_rl.types import LLMResource, Resources

__all__ = ["HostedSFTConfig", "HostedSFT", "HostedJob", "HostedFineTuningError", "TERMINAL_JOB_STATUSES"]

log = logging.getLogger(__name__)

TERMINAL_JOB_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


class HostedFineTuningError(LightningError, RuntimeError):
    """The fine-tuning API refused a request or the job did not succeed; the message quotes the API."""

    def __init__(self, message: str, *, job_id: str | None = None, status: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.status = status


@dataclass
class HostedSFTConfig:
    """Where to fine-tune and how to wait for it."""

    base_url: str
    """The API's base URL, with its version: ``https://api.openai.com/v1``."""
    model: str
    """The base model to fine-tune, e.g. ``gpt-4.1-mini-2025-04-14``."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable that holds the API key (read when the job starts)."""
    suffix: str | None = None
    """Added to the fine-tuned model's name by the provider."""
    n_epochs: int | None = None
    """Epochs over the file (None: the provider's automatic choice)."""
    unit: SftUnit = "call"
    """One example per kept call, or per conversation of a role in a rollout (``export_sft``)."""
    tools: list[dict[str, Any]] | None = None
    """Tool definitions written with every example (the gateway does not record the tools offered)."""
    poll_initial_s: float = 2.0
    """First wait between status polls; it grows by ``poll_backoff`` up to ``poll_max_s``."""
    poll_max_s: float = 60.0
    poll_backoff: float = 1.5
    timeout_s: float | None = None
    """Cancel the job and fail when it has not ended after this long (None: wait as long as it takes)."""
    publish: bool = True
    """Publish the fine-tuned model as a new resources version of the store."""
    llm_base_url: str | None = None
    """The base URL agents call the fine-tuned model at (None: ``base_url``)."""
    request_timeout_s: float = 120.0
    """One HTTP request's limit (an upload of a large file takes a while)."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must be an http(s) URL such as https://api.openai.com/v1, got {self.base_url!r}."
            )
        if not self.model:
            raise ValueError("model must name the base model to fine-tune (e.g. gpt-4.1-mini-2025-04-14).")
        if self.poll_initial_s <= 0 or self.poll_max_s < self.poll_initial_s or self.poll_backoff < 1:
            raise ValueError("polling needs 0 < poll_initial_s <= poll_max_s and poll_backoff >= 1.")
        if self.n_epochs is not None and self.n_epochs < 1:
            raise ValueError(f"n_epochs must be >= 1 or None, got {self.n_epochs}.")


@dataclass
class HostedJob:
    """A finished hosted fine-tuning job."""

    id: str
    status: str
    training_file: str
    fine_tuned_model: str | None
    export: ExportReport
    resources: Resources | None = None
    """The resources version published with the fine-tuned model (None: not published)."""
    statuses: list[str] = field(default_factory=list[str])
    """Every status the job was seen in, in order (repeats folded)."""


def _api_error(response: httpx.Response, what: str) -> HostedFineTuningError:
    """The API's own words: ``error.message`` (and ``code``) of an OpenAI-style error body."""
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    error: Any = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        err = cast(dict[str, Any], error)
        message = str(err.get("message") or err)
        code = f" ({err['code']})" if err.get("code") else ""
    else:
        message, code = response.text.strip()[:500] or response.reason_phrase, ""
    return HostedFineTuningError(f"{what} failed: HTTP {response.status_code}{code}: {message}")


class HostedSFT:
    """``HostedSFT(HostedSFTConfig(base_url=..., model=...)).fit(store_url, Selection(min_reward=1))``."""

    def __init__(
        self, config: HostedSFTConfig, *, on_status: Callable[[str, dict[str, Any]], None] | None = None
    ) -> None:
        self.config = config
        self.on_status = on_status
        """Called with each new job status and the job object (the CLI prints a line)."""
        self._statuses: list[str] = []

    def fit(self, store_url: str, selection: Selection | None = None) -> HostedJob:
        """Run the whole path against the store at ``store_url`` (blocking)."""

        async def run() -> HostedJob:
            from lightning_rl.store import open_store

            store = await open_store(store_url)
            try:
                return await self.fit_async(store, selection)
            finally:
                await store.close()

        return asyncio.run(run())

    async def fit_async(
        self,
        store: LightningStore,
        selection: Selection | None = None,
        *,
        workdir: str | os.PathLike[str] | None = None,
    ) -> HostedJob:
        """Export, upload, create the job, wait for it, publish the model (see the module docstring)."""
        cfg = self.config
        key = os.environ.get(cfg.api_key_env)
        if not key:
            raise PermissionError(f"no API key: set {cfg.api_key_env} to the fine-tuning provider's key.")
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            path = Path(tmp) / "train.jsonl"
            report = await export_sft(store, path, selection=selection, fmt="openai", unit=cfg.unit, tools=cfg.tools)
            if report.records == 0:
                raise ValueError(
                    "the selection kept no example to fine-tune on; loosen the filters (--min-reward, --role)."
                )
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(
                base_url=cfg.base_url.rstrip("/") + "/", headers=headers, timeout=cfg.request_timeout_s
            ) as client:
                try:
                    file_id = await self._upload(client, path)
                    job = await self._create(client, file_id)
                    job = await self._wait(client, job)
                except httpx.TransportError as exc:
                    raise HostedFineTuningError(
                        f"could not reach the fine-tuning API at {cfg.base_url}: {exc!r}; check the URL and network."
                    ) from exc
        model = job.get("fine_tuned_model")
        result = HostedJob(str(job["id"]), str(job["status"]), file_id, model, report, statuses=self._statuses)
        if cfg.publish and model:
            result.resources = await self._publish(store, str(model), result.id)
        return result

    async def _upload(self, client: httpx.AsyncClient, path: Path) -> str:
        with path.open("rb") as fh:
            response = await client.post(
                "files", data={"purpose": "fine-tune"}, files={"file": (path.name, fh, "application/jsonl")}
            )
        if response.status_code >= 400:
            raise _api_error(response, "uploading the training file (POST /files)")
        return str(response.json()["id"])

    async def _create(self, client: httpx.AsyncClient, file_id: str) -> dict[str, Any]:
        cfg = self.config
        body: dict[str, Any] = {"model": cfg.model, "training_file": file_id}
        if cfg.suffix:
            body["suffix"] = cfg.suffix
        if cfg.n_epochs is not None:
            body["method"] = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": cfg.n_epochs}}}
        response = await client.post("fine_tuning/jobs", json=body)
        if response.status_code >= 400:
            raise _api_error(response, "creating the fine-tuning job (POST /fine_tuning/jobs)")
        job = cast(dict[str, Any], response.json())
        self._statuses = []
        self._seen(job)
        return job

    def _seen(self, job: dict[str, Any]) -> None:
        status = str(job.get("status"))
        if not self._statuses or self._statuses[-1] != status:
            self._statuses.append(status)
            log.info("fine-tuning job %s: %s", job.get("id"), status)
            if self.on_status is not None:
                self.on_status(status, job)

    async def _wait(self, client: httpx.AsyncClient, job: dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        job_id = str(job["id"])
        loop = asyncio.get_running_loop()
        deadline = None if cfg.timeout_s is None else loop.time() + cfg.timeout_s
        delay = cfg.poll_initial_s
        try:
            while job.get("status") not in TERMINAL_JOB_STATUSES:
                if deadline is not None and loop.time() >= deadline:
                    await self._cancel(client, job_id)
                    raise HostedFineTuningError(
                        f"fine-tuning job {job_id} did not end within {cfg.timeout_s:g} s; it was cancelled "
                        "(raise timeout_s, or None to wait as long as it takes).",
                        job_id=job_id,
                        status="cancelled",
                    )
                await asyncio.sleep(delay if deadline is None else max(0.0, min(delay, deadline - loop.time())))
                delay = min(delay * cfg.poll_backoff, cfg.poll_max_s)
                response = await client.get(f"fine_tuning/jobs/{job_id}")
                if response.status_code >= 400:
                    raise _api_error(response, f"reading fine-tuning job {job_id}")
                job = cast(dict[str, Any], response.json())
                self._seen(job)
        except (asyncio.CancelledError, KeyboardInterrupt):
            await asyncio.shield(self._cancel(client, job_id))
            raise
        status = str(job["status"])
        if status == "failed":
            error: Any = job.get("error")
            err = cast(dict[str, Any], error) if isinstance(error, dict) else {}
            code = f" ({err['code']})" if err.get("code") else ""
            reason = err.get("message") or "the API gave no reason"
            raise HostedFineTuningError(
                f"fine-tuning job {job_id} failed{code}: {reason}", job_id=job_id, status=status
            )
        if status == "cancelled":
            raise HostedFineTuningError(
                f"fine-tuning job {job_id} was cancelled (by someone else: this run did not ask).",
                job_id=job_id,
                status=status,
            )
        if not job.get("fine_tuned_model"):
            raise HostedFineTuningError(
                f"fine-tuning job {job_id} succeeded without a fine_tuned_model name", job_id=job_id, status=status
            )
        return job

    async def _cancel(self, client: httpx.AsyncClient, job_id: str) -> None:
        """Ask the API to cancel; a failure is logged, never raised over the reason we are stopping."""
        try:
            response = await client.post(f"fine_tuning/jobs/{job_id}/cancel", timeout=30.0)
        except httpx.HTTPError as exc:
            log.warning("could not cancel fine-tuning job %s (%s); cancel it by hand", job_id, exc)
            return
        if response.status_code >= 400:
            log.warning("%s; cancel it by hand", _api_error(response, f"cancelling fine-tuning job {job_id}"))
            return
        self._seen(cast(dict[str, Any], response.json()))

    async def _publish(self, store: LightningStore, model: str, job_id: str) -> Resources:
        cfg = self.config
        try:
            previous: Resources | None = await store.get_resources()
        except NotFoundError:
            previous = None
        old = previous.llm if previous is not None else None
        llm = LLMResource(base_url=cfg.llm_base_url or cfg.base_url, model=model)
        if old is not None:
            llm.api_key, llm.sampling = old.api_key, dict(old.sampling)
        extra: dict[str, object] = {**(previous.extra if previous else {})}
        extra.update(fine_tuning_job=job_id, fine_tuned_from=cfg.model)
        return await store.add_resources(llm=llm, prompts=previous.prompts if previous else None, extra=extra)
