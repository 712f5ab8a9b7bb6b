"""Redis store: a shared store on a Redis server, for teams that already run one.

Why it looks like this:

* **Two atomic paths.** The two hot spots where many clients meet run as **Lua scripts**, which Redis
  executes one at a time with nothing in between: ``claim`` pops waiting rollouts off one sorted
  set and opens their attempts in the same script (two claimers can never take one rollout, and
  they never retry against each other), and ``add_spans`` checks its attempts and writes each span
  only if its ``(trace_id, span_id)`` is new (idempotent even when two clients send one batch at
  once). Everything else (finish, heartbeat, cancel, expiry, enqueue, prune) changes one rollout or a
  few at a time and runs as an **optimistic transaction** (``WATCH`` the keys, read, decide in
  Python, ``MULTI``/``EXEC``; retried if a watched key changed), so *what* happens is decided by
  ``store.base`` and ``store._sql``, the very functions the other backends call.
* **Layout.** Under a key prefix (default ``lightning:``): one hash per rollout (``r:<id>``) and per
  attempt (``a:<id>``) whose fields hold JSON values (floats written as their shortest round-trip
  text, so a value reads back bit for bit); sorted sets for the order of rollouts (``rollouts``,
  by ``seq``), the queue (``waiting``, by ``seq``), running attempts (``running``, by deadline, so
  expiry is one range query that finds nothing in the common case), all attempts (``attempts``) and
  ended rollouts (``ended``, by ``ended_at``, for ``prune``); one list of span JSON per attempt
  (``s:<attempt>``, in ``seq`` order) and one hash of every span key (``sk``); status counters
  (``nr``, ``na``) kept in the same transactions, so ``stats`` does not scan.
* **Durability is the server's.** An acknowledged write is in the server's memory; it survives a
  crash only if the server logs it: ``appendonly yes`` with ``appendfsync always`` loses nothing
  acknowledged, ``everysec`` up to about a second (see docs/stores.md). ``open`` reads the server's
  settings and logs a warning when it keeps nothing on disk.
* **Standalone Redis only**: the scripts build key names from the prefix, which Redis Cluster does
  not allow. Clocks come from the caller (``time.time()``), as in the other backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from lightning_rl.errors import InvalidRequestError, StoreUnavailableError
from lightning_rl.store import _sql as q
from lightning_rl.store._spanjson import dump_span
from lightning_rl.store.base import (
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    attempt_deadline,
    check_batch,
    check_page,
    expiry_reason,
    now,
)
from lightning_rl.types import (
    TERMINAL_ROLLOUT,
    Attempt,
    AttemptStatus,
    Claim,
    LLMResource,
    Resources,
    Rollout,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
    check_attempt_transition,
    new_gateway_key,
    new_id,
)

try:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError, WatchError
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("RedisStore needs redis-py: install it with `pip install 'lightning-rl[redis]'`.") from exc

__all__ = ["RedisStore", "DEFAULT_URL", "DEFAULT_PREFIX"]

DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX: Final = "lightning:"
SCHEMA_VERSION: Final = 1
_RETRIES: Final = 200
"""Optimistic transactions retried this often before giving up (each conflict means another client
changed the same rollout meanwhile, so progress is made by someone every time)."""

_EXPIRE_BATCH: Final = 100
"""Overdue attempts ended in one transaction."""
_POOL_WAIT_S: Final = 60.0
"""How long a call waits for a free connection before it reports the store unavailable."""

_log = logging.getLogger(__name__)
T = TypeVar("T")
Writes = Callable[[Any], bool | None]
"""Queues a transaction's writes on the pipeline; returns True when they end a rollout (waiters wake)."""

_WAITING = ('"queued"', '"requeued"')
_RUNNING = json.dumps(AttemptStatus.RUNNING.value)

# --------------------------------------------------------------------------------------------
# Lua scripts (ARGV[1] is the key prefix; values are JSON text, as stored)
# --------------------------------------------------------------------------------------------

_CLAIM_LUA = """
local p, n, worker, t, worker_tmo = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local tnum = tonumber(t)
local out = {}
local i = 0
while i < n do
  local popped = redis.call('ZPOPMIN', p .. 'waiting')
  if #popped == 0 then break end
  local rid = popped[1]
  local rkey = p .. 'r:' .. rid
  local status = redis.call('HGET', rkey, 'status')
  if status == '"queued"' or status == '"requeued"' then
    i = i + 1
    local aid, gkey = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
    local number = redis.call('HINCRBY', rkey, 'attempt_count', 1)
    redis.call('HSET', rkey, 'status', '"running"', 'updated_at', t)
    -- attempt_timeout and attempt_deadline of store.base, on the values enqueue stored for them
    local tmo = redis.call('HGET', rkey, '_tmo')
    if tmo == 'null' then tmo = worker_tmo end
    local deadline = tnum + tonumber(redis.call('HGET', rkey, '_hb'))
    if tmo ~= 'null' then deadline = math.min(deadline, tnum + tonumber(tmo)) end
    local dl = string.format('%.17g', deadline)
    local akey = p .. 'a:' .. aid
    local aseq = redis.call('INCR', p .. 'aseq')
    redis.call('HSET', akey, 'id', '"' .. aid .. '"', 'rollout_id', redis.call('HGET', rkey, 'id'),
      'number', number, 'worker_id', worker, 'status', '"running"', 'started_at', t, 'heartbeat_at', t,
      'ended_at', 'null', 'deadline', dl, 'timeout_s', tmo, 'gateway_key', gkey, 'error', 'null',
      'reward', 'null', '_seq', aseq)
    redis.call('RPUSH', p .. 'ra:' .. rid, aid)
    redis.call('ZADD', p .. 'attempts', aseq, aid)
    redis.call('ZADD', p .. 'running', dl, aid)
    redis.call('HINCRBY', p .. 'nr', status, -1)
    redis.call('HINCRBY', p .. 'nr', '"running"', 1)
    redis.call('HINCRBY', p .. 'na', '"running"', 1)
    out[#out + 1] = {redis.call('HGETALL', rkey), redis.call('HGETALL', akey)}
  end
end
return out
"""
"""Take up to n waiting rollouts, oldest first, and open an attempt on each (ARGV[6..]: attempt id
and JSON gateway key per slot). Stale queue entries (a rollout no longer waiting) are dropped."""

_ADD_SPANS_LUA = """
local p = ARGV[1]
local n = (#ARGV - 1) / 5
for i = 0, n - 1 do
  local aid, rid_json = ARGV[3 + 5 * i], ARGV[4 + 5 * i]
  if redis.call('HGET', p .. 'a:' .. aid, 'rollout_id') ~= rid_json then return -(i + 1) end
end
local added = 0
for i = 0, n - 1 do
  local key, aid, head, tail = ARGV[2 + 5 * i], ARGV[3 + 5 * i], ARGV[5 + 5 * i], ARGV[6 + 5 * i]
  if redis.call('HSETNX', p .. 'sk', key, aid) == 1 then
    local list = p .. 's:' .. aid
    local seq = redis.call('LLEN', list) + 1
    redis.call('RPUSH', list, head .. seq .. tail)
    added = added + 1
  end
end
return added
"""
"""All or nothing: -(i+1) if span i names a missing attempt (or one of another rollout), else the
number of new spans, each written with ``seq`` = its place in its attempt's list."""

_ADD_RESOURCES_LUA = """
local version = redis.call('HLEN', ARGV[1] .. 'res') + 1
redis.call('HSET', ARGV[1] .. 'res', version, ARGV[2])
return version
"""

_SEQ_MARK = -7_351_960_284_113
"""A ``seq`` written into span JSON and replaced by the script with the real one (``seq`` is the
span's last field, so its last occurrence is the span's own)."""

_ROLLOUT_MUTABLE = ("status", "attempt_count", "updated_at", "ended_at", "final_reward", "error")


# --------------------------------------------------------------------------------------------
# Encoding: hash fields hold JSON values
# --------------------------------------------------------------------------------------------


def _decode(fields: dict[str, str]) -> dict[str, Any]:
    return {k: json.loads(v) for k, v in fields.items() if not k.startswith("_")}


def _pairs(flat: Sequence[str]) -> dict[str, str]:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


def _rollout_fields(r: Rollout, only: Sequence[str] | None = None) -> dict[str, str]:
    data = r.model_dump(mode="json", include=set(only) if only else None)
    return {k: json.dumps(v) for k, v in data.items()}


def _attempt_fields(a: Attempt) -> dict[str, str]:
    return {k: json.dumps(v) for k, v in a.model_dump(mode="json").items()}


def _span_key(span: Span) -> str:
    """``(trace_id, span_id)`` as one string (length-prefixed: no separator can be ambiguous)."""
    return f"{len(span.trace_id)}:{span.trace_id}{span.span_id}"


def _split_span(span: Span) -> tuple[str, str]:
    text = dump_span(span, _SEQ_MARK)
    head, mark, tail = text.rpartition(f'"seq":{_SEQ_MARK}')
    if not mark or tail != "}":  # pragma: no cover - dump_span always writes seq last
        raise AssertionError(f"unexpected span JSON layout: ...{text[-80:]!r}")
    return head + '"seq":', tail


def _float_json(value: float | None) -> str:
    return "null" if value is None else json.dumps(float(value))


def _parse_url(url: str, prefix: str | None) -> tuple[str, str]:
    """Split a ``prefix=`` query parameter (ours, not redis-py's) off the URL."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    found = [v for k, v in query if k == "prefix"]
    rest = urlencode([(k, v) for k, v in query if k != "prefix"])
    chosen = prefix if prefix is not None else (found[-1] if found else DEFAULT_PREFIX)
    if not chosen:
        raise InvalidRequestError("the Redis key prefix must not be empty; the default is 'lightning:'.")
    return urlunsplit(parts._replace(query=rest)), chosen


class RedisStore:
    """A store on a Redis server (see the module docstring). Create it with ``await RedisStore.open(url)``."""

    def __init__(self, client: aioredis.Redis, prefix: str, poll_s: float, max_connections: int) -> None:
        """Use ``RedisStore.open``; this only records the settings."""
        # redis-py types its replies as ``Awaitable[Any] | Any``; the store talks to it as Any.
        self._r: Any = client
        self._p = prefix
        self._poll_s = poll_s
        self._closed = False
        self._waiters: set[asyncio.Event] = set()
        # A transaction holds its WATCH connection while its reads take another from the pool: with
        # at most max_connections - 1 transactions open, one connection is always left for those
        # reads, so transactions can never wait on each other for connections (no deadlock).
        self._txn_slots = asyncio.Semaphore(max_connections - 1)
        self._expire_lock = asyncio.Lock()
        self._claim_lua: Any = self._r.register_script(_CLAIM_LUA)
        self._spans_lua: Any = self._r.register_script(_ADD_SPANS_LUA)
        self._resources_lua: Any = self._r.register_script(_ADD_RESOURCES_LUA)
        self.persistence: dict[str, str] = {}
        """The server's ``appendonly`` / ``appendfsync`` / ``save`` settings as read at open (empty if
        the server does not allow ``CONFIG GET``)."""

    @classmethod
    async def open(
        cls, url: str = DEFAULT_URL, *, prefix: str | None = None, poll_s: float = 0.05, max_connections: int = 32
    ) -> RedisStore:
        """Connect, check the key layout's version, and return the store.

        Args:
            url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS). A ``prefix=``
                query parameter sets the key prefix.
            prefix: The prefix of every key (default ``lightning:``); one Redis database can hold
                several stores under different prefixes.
            poll_s: How often ``wait_for_rollouts`` re-reads for other clients' changes.
            max_connections: Most connections used at once (at least 2: a transaction holds one for
                its ``WATCH`` while it reads on another).
        """
        if max_connections < 2:
            raise InvalidRequestError(f"max_connections must be >= 2, got {max_connections}.")
        redis_url, chosen = _parse_url(url, prefix)
        # A blocking pool: a caller waits for a free connection instead of failing with "Too many connections".
        pool = aioredis.BlockingConnectionPool.from_url(
            redis_url, max_connections=max_connections, timeout=_POOL_WAIT_S, decode_responses=True
        )
        client = aioredis.Redis.from_pool(pool)
        store = cls(client, chosen, poll_s, max_connections)
        try:
            async with store._guard():
                meta = store._p + "meta"
                await store._r.hsetnx(meta, "schema_version", str(SCHEMA_VERSION))
                version = await store._r.hget(meta, "schema_version")
                if version != str(SCHEMA_VERSION):
                    raise StoreUnavailableError(
                        f"Redis store under prefix {chosen!r} has layout version {version}, this Lightning expects "
                        f"{SCHEMA_VERSION}; use another prefix or the matching Lightning version."
                    )
                await store._read_persistence()
        except BaseException:
            await client.aclose()
            raise
        return store

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self._p!r})"

    @property
    def prefix(self) -> str:
        """The prefix of every key this store writes."""
        return self._p

    async def _read_persistence(self) -> None:
        try:
            for name in ("appendonly", "appendfsync", "save"):
                self.persistence.update(await self._r.config_get(name))
        except RedisError:  # CONFIG is often disabled on managed servers: nothing to check then
            return
        if self.persistence.get("appendonly") != "yes":
            _log.warning(
                "the Redis server keeps no append-only file (appendonly %s, save %r): acknowledged writes are lost "
                "if it crashes. Set appendonly yes and appendfsync always (or everysec) for a durable store.",
                self.persistence.get("appendonly"),
                self.persistence.get("save"),
            )

    # --- keys -------------------------------------------------------------------------------
    def _rk(self, rollout_id: str) -> str:
        return f"{self._p}r:{rollout_id}"

    def _ak(self, attempt_id: str) -> str:
        return f"{self._p}a:{attempt_id}"

    def _rak(self, rollout_id: str) -> str:
        return f"{self._p}ra:{rollout_id}"

    def _sk(self, attempt_id: str) -> str:
        return f"{self._p}s:{attempt_id}"

    def _k(self, name: str) -> str:
        return self._p + name

    # --- rollouts ---------------------------------------------------------------------------
    async def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        check_batch("enqueue", len(requests))
        reqs = [q.normalised(r) for r in requests]
        if not reqs:
            return []
        unique = list(dict.fromkeys(r.id for r in reqs))

        async def txn(pipe: Any) -> tuple[list[Rollout], Writes]:
            await pipe.watch(*(self._rk(rid) for rid in unique))
            found = {r.id: r for r in await self._load_rollouts(unique) if r is not None}
            fresh: list[Rollout] = []
            t = now()
            for req in reqs:
                stored = found.get(req.id)
                if stored is not None:
                    q.check_resend(stored, req)
                    continue
                rollout = Rollout(**req.model_dump(), created_at=t, updated_at=t)
                found[req.id] = rollout
                fresh.append(rollout)
            if fresh:
                last = int(await self._r.incrby(self._k("rseq"), len(fresh)))
                for i, rollout in enumerate(fresh):
                    rollout.seq = last - len(fresh) + 1 + i

            def write(p: Any) -> None:
                for rollout in fresh:
                    fields = _rollout_fields(rollout)
                    fields["_hb"] = _float_json(
                        rollout.config.heartbeat_timeout_s
                        if rollout.config.heartbeat_timeout_s is not None
                        else DEFAULT_HEARTBEAT_TIMEOUT_S
                    )
                    fields["_tmo"] = _float_json(rollout.config.timeout_s)
                    p.hset(self._rk(rollout.id), mapping=fields)
                if fresh:
                    p.zadd(self._k("rollouts"), {r.id: r.seq for r in fresh})
                    p.zadd(self._k("waiting"), {r.id: r.seq for r in fresh})
                    p.hincrby(self._k("nr"), json.dumps(RolloutStatus.QUEUED.value), len(fresh))

            return q.unshared([found[r.id] for r in reqs]), write

        return await self._transact(txn)

    async def claim(self, worker_id: str, n: int = 1, *, timeout_s: float | None = None) -> list[Claim]:
        q.check_claim_args(worker_id, n, timeout_s)
        async with self._guard():
            await self._expire(now())
            slots: list[str] = []
            for _ in range(n):
                slots += [new_id("at-"), json.dumps(new_gateway_key())]
            args = [self._p, n, json.dumps(worker_id), json.dumps(now()), _float_json(timeout_s), *slots]
            rows: list[list[list[str]]] = await self._claim_lua(keys=[], args=args)
        return [
            Claim(
                rollout=Rollout.model_validate(_decode(_pairs(r))),
                attempt=Attempt.model_validate(_decode(_pairs(a))),
            )
            for r, a in rows
        ]

    async def heartbeat(self, attempt_id: str) -> Attempt:
        async with self._guard():
            await self._expire(now())

        async def txn(pipe: Any) -> tuple[Attempt, Writes]:
            await pipe.watch(self._ak(attempt_id))
            attempt = await self._attempt(attempt_id)
            if attempt.status is not AttemptStatus.RUNNING:
                check_attempt_transition(attempt.id, attempt.status, AttemptStatus.RUNNING)
            rollout = await self._rollout(attempt.rollout_id)
            t = now()
            attempt.heartbeat_at = t
            attempt.deadline = attempt_deadline(rollout.config, attempt.started_at, t, attempt.timeout_s)
            deadline = attempt.deadline

            def write(p: Any) -> None:
                p.hset(self._ak(attempt.id), mapping={"heartbeat_at": json.dumps(t), "deadline": json.dumps(deadline)})
                p.zadd(self._k("running"), {attempt.id: deadline})

            return attempt, write

        return await self._transact(txn)

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        reward: float | None = None,
    ) -> Rollout:
        q.check_finish(status, reward)
        async with self._guard():
            await self._expire(now())
            rollout_id = await self._rollout_of(attempt_id)

        async def txn(pipe: Any) -> tuple[Rollout, Writes]:
            await pipe.watch(self._rk(rollout_id), self._ak(attempt_id))
            rollout, attempt = await self._rollout(rollout_id), await self._attempt(attempt_id)
            before = rollout.status
            q.end_attempt(rollout, attempt, status, None, error, reward, now())
            return rollout, lambda p: self._write_changes(p, [(before, rollout, attempt)])

        return await self._transact(txn)

    async def cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        check_batch("cancel", len(rollout_ids))
        ids = list(rollout_ids)
        if not ids:
            return []
        unique = list(dict.fromkeys(ids))

        async def txn(pipe: Any) -> tuple[list[Rollout], Writes]:
            await pipe.watch(*(self._rk(rid) for rid in unique))
            loaded = await self._load_rollouts(unique)
            rollouts: dict[str, Rollout] = {}
            for rid, rollout in zip(unique, loaded, strict=True):
                if rollout is None:
                    raise q.rollout_not_found(rid)
                rollouts[rid] = rollout
            live = [rid for rid in unique if rollouts[rid].status not in TERMINAL_ROLLOUT]
            running = await self._running_attempts(pipe, live)
            t = now()
            changed: list[tuple[RolloutStatus, Rollout, Attempt | None]] = []
            for rid in live:
                rollout, attempt = rollouts[rid], running.get(rid)
                before = rollout.status
                if q.cancel_rollout(rollout, attempt, t):
                    changed.append((before, rollout, attempt))
            return q.unshared([rollouts[rid] for rid in ids]), lambda p: self._write_changes(p, changed)

        return await self._transact(txn)

    async def get_rollout(self, rollout_id: str) -> Rollout:
        async with self._guard():
            await self._expire(now())
            return await self._rollout(rollout_id)

    async def query_rollouts(
        self,
        *,
        ids: Sequence[str] | None = None,
        status: Sequence[RolloutStatus] | None = None,
        group_id: str | None = None,
        mode: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> list[Rollout]:
        check_page(limit, offset)
        statuses = None if status is None else set(status)

        def keep(r: Rollout) -> bool:
            return (
                (statuses is None or r.status in statuses)
                and (group_id is None or r.group_id == group_id)
                and (mode is None or r.mode == mode)
            )

        async with self._guard():
            await self._expire(now())
            if ids is not None:
                found = [r for r in await self._load_rollouts(list(dict.fromkeys(ids))) if r is not None]
                found.sort(key=lambda r: r.seq)
                return [r for r in found if keep(r)][offset : offset + limit]
            if statuses is None and group_id is None and mode is None:
                page: list[str] = await self._r.zrange(self._k("rollouts"), offset, offset + limit - 1)
                return [r for r in await self._load_rollouts(page) if r is not None]
            out: list[Rollout] = []
            skipped, start, chunk = 0, 0, 1000
            while len(out) < limit:
                some: list[str] = await self._r.zrange(self._k("rollouts"), start, start + chunk - 1)
                if not some:
                    break
                start += chunk
                for r in await self._load_rollouts(some):
                    if r is None or not keep(r):
                        continue
                    if skipped < offset:
                        skipped += 1
                    elif len(out) < limit:
                        out.append(r)
            return out

    async def wait_for_rollouts(self, ids: Sequence[str], timeout_s: float) -> list[Rollout]:
        wanted = list(ids)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        changed = asyncio.Event()
        self._waiters.add(changed)
        try:
            while True:
                changed.clear()
                async with self._guard():
                    await self._expire(now())
                    ended = await self._ended(wanted)
                remaining = deadline - loop.time()
                if len(ended) == len(wanted) or remaining <= 0:
                    return ended
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=min(remaining, self._poll_s))
        finally:
            self._waiters.discard(changed)

    # --- attempts ---------------------------------------------------------------------------
    async def get_attempt(self, attempt_id: str) -> Attempt:
        async with self._guard():
            await self._expire(now())
            return await self._attempt(attempt_id)

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        async with self._guard():
            await self._expire(now())
            await self._rollout(rollout_id)
            aids: list[str] = await self._r.lrange(self._rak(rollout_id), 0, -1)
            return [a for a in await self._load_attempts(aids) if a is not None]

    # --- spans ------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> int:
        check_batch("add_spans", len(spans))
        if not spans:
            return 0
        args: list[str] = [self._p]
        for span in spans:
            head, tail = _split_span(span)
            args += [_span_key(span), span.attempt_id, json.dumps(span.rollout_id), head, tail]
        async with self._guard():
            result = int(await self._spans_lua(keys=[], args=args))
        if result < 0:
            bad = spans[-result - 1]
            q.check_span_targets([bad], {})  # raises NotFoundError naming the span and its attempt
        return result

    async def query_spans(
        self,
        *,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        name: str | None = None,
        limit: int = 10_000,
        offset: int = 0,
    ) -> list[Span]:
        check_page(limit, offset)
        async with self._guard():
            if attempt_id is not None:
                owner = await self._r.hget(self._ak(attempt_id), "rollout_id")
                inside = owner is not None and (rollout_id is None or json.loads(owner) == rollout_id)
                aids = [attempt_id] if inside else []
            elif rollout_id is not None:
                aids = await self._r.lrange(self._rak(rollout_id), 0, -1)
            else:
                aids = await self._r.zrange(self._k("attempts"), 0, -1)
            if name is not None:
                texts = await self._span_texts(aids, 0, None)
                named = [s for s in map(Span.model_validate_json, texts) if s.name == name]
                return named[offset : offset + limit]
            return [Span.model_validate_json(text) for text in await self._span_texts(aids, offset, limit)]

    async def _span_texts(self, aids: list[str], offset: int, limit: int | None) -> list[str]:
        """Span JSON of ``aids`` in order, ``offset``/``limit`` applied across attempts by list lengths."""
        if not aids:
            return []
        pipe = self._r.pipeline(transaction=False)
        for aid in aids:
            pipe.llen(self._sk(aid))
        lengths: list[int] = await pipe.execute()
        pipe = self._r.pipeline(transaction=False)
        skip, left = offset, limit
        for aid, length in zip(aids, lengths, strict=True):
            if left is not None and left <= 0:
                break
            if skip >= length:
                skip -= length
                continue
            stop = length - 1 if left is None else min(length - 1, skip + left - 1)
            pipe.lrange(self._sk(aid), skip, stop)
            if left is not None:
                left -= stop - skip + 1
            skip = 0
        return [text for chunk in await pipe.execute() for text in chunk]

    # --- resources --------------------------------------------------------------------------
    async def add_resources(
        self,
        *,
        llm: LLMResource | None = None,
        prompts: dict[str, str] | None = None,
        extra: dict[str, object] | None = None,
    ) -> Resources:
        res = Resources(version=1, llm=llm, prompts=prompts or {}, extra=extra or {})
        async with self._guard():
            res.version = int(
                await self._resources_lua(keys=[], args=[self._p, res.model_dump_json(exclude={"version"})])
            )
        return res

    async def get_resources(self, version: int | None = None) -> Resources:
        async with self._guard():
            latest = int(await self._r.hlen(self._k("res")))
            wanted = latest if version is None else version
            data = await self._r.hget(self._k("res"), str(wanted)) if latest else None
        if data is None:
            raise q.resources_not_found(version, latest)
        return Resources.model_validate({**json.loads(data), "version": wanted})

    # --- housekeeping -----------------------------------------------------------------------
    async def expire(self, now: float | None = None) -> int:
        async with self._guard():
            return await self._expire(time.time() if now is None else now)

    async def prune(self, older_than: float) -> int:
        async with self._guard():
            doomed: list[str] = await self._r.zrangebyscore(self._k("ended"), "-inf", f"({older_than!r}")
        pruned = 0
        for rid in doomed:
            pruned += await self._prune_one(rid, older_than)
        return pruned

    async def _prune_one(self, rid: str, older_than: float) -> int:
        async def txn(pipe: Any) -> tuple[int, Writes]:
            await pipe.watch(self._rk(rid), self._rak(rid))
            rollout = (await self._load_rollouts([rid]))[0]
            ended = rollout is not None and rollout.ended_at is not None and rollout.ended_at < older_than
            if rollout is None or not ended or rollout.status not in TERMINAL_ROLLOUT:
                return 0, lambda p: None
            aids: list[str] = await self._r.lrange(self._rak(rid), 0, -1)
            if aids:
                await pipe.watch(*(self._sk(a) for a in aids), *(self._ak(a) for a in aids))
            attempts = [a for a in await self._load_attempts(aids) if a is not None]
            texts = await self._span_texts(aids, 0, None)
            keys = [_span_key(Span.model_validate_json(t)) for t in texts]

            def write(p: Any) -> None:
                p.delete(self._rk(rid), self._rak(rid), *(self._ak(a) for a in aids), *(self._sk(a) for a in aids))
                if keys:
                    p.hdel(self._k("sk"), *keys)
                p.zrem(self._k("rollouts"), rid)
                p.zrem(self._k("ended"), rid)
                p.zrem(self._k("waiting"), rid)
                if aids:
                    p.zrem(self._k("attempts"), *aids)
                    p.zrem(self._k("running"), *aids)
                p.hincrby(self._k("nr"), json.dumps(rollout.status.value), -1)
                for a in attempts:
                    p.hincrby(self._k("na"), json.dumps(a.status.value), -1)

            return 1, write

        return await self._transact(txn)

    async def stats(self) -> StoreStats:
        async with self._guard():
            await self._expire(now())
            pipe = self._r.pipeline(transaction=True)  # one consistent snapshot of the counters
            pipe.hgetall(self._k("nr"))
            pipe.hgetall(self._k("na"))
            pipe.hlen(self._k("sk"))
            pipe.hlen(self._k("res"))
            nr, na, spans, resources = await pipe.execute()
        return StoreStats(
            rollouts_by_status=_counts(nr),
            attempts_by_status=_counts(na),
            spans=int(spans),
            resources_versions=int(resources),
        )

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._r.aclose()

    # --- plumbing ---------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _guard(self) -> AsyncGenerator[None]:
        """Turn the driver's errors into ``StoreUnavailableError`` (the store's own errors pass)."""
        if self._closed:
            raise StoreUnavailableError(f"{self!r} is closed; open a new RedisStore.")
        try:
            yield
        except RedisError as exc:
            raise StoreUnavailableError(
                f"Redis store failed: {exc}; the operation was not applied (or, for a lost connection, may have "
                "been), retry it later: every write is idempotent or checked."
            ) from exc

    async def _transact(self, body: Callable[[Any], Awaitable[tuple[T, Writes]]]) -> T:
        """Run ``body`` (which WATCHes, reads and returns a result plus the writes to queue) and commit
        the writes with MULTI/EXEC; start over when a watched key changed meanwhile."""
        async with self._guard(), self._txn_slots:
            for attempt in range(_RETRIES):
                async with self._r.pipeline(transaction=True) as pipe:
                    result, write = await body(pipe)
                    pipe.multi()
                    ends = write(pipe)
                    try:
                        await pipe.execute()
                    except WatchError:
                        await asyncio.sleep(min(0.0005 * (attempt + 1), 0.02))
                        continue
                    if ends:
                        self._wake_waiters()
                    return result
        raise StoreUnavailableError(
            f"{self!r}: the same rollouts changed under {_RETRIES} tries in a row; retry the operation."
        )

    def _wake_waiters(self) -> None:
        for event in self._waiters:
            event.set()

    def _write_changes(self, p: Any, changes: Sequence[tuple[RolloutStatus, Rollout, Attempt | None]]) -> bool:
        """Queue the writes of rollouts (and their attempts) moved on by ``end_attempt``/``cancel_rollout``,
        with the queue, running set, ended set and counters kept in step; return whether a rollout ended."""
        ended = False
        for before, rollout, attempt in changes:
            p.hset(self._rk(rollout.id), mapping=_rollout_fields(rollout, _ROLLOUT_MUTABLE))
            if before is not rollout.status:
                p.hincrby(self._k("nr"), json.dumps(before.value), -1)
                p.hincrby(self._k("nr"), json.dumps(rollout.status.value), 1)
            if rollout.status is RolloutStatus.REQUEUED:
                p.zadd(self._k("waiting"), {rollout.id: rollout.seq})
            elif before.value in ("queued", "requeued"):
                p.zrem(self._k("waiting"), rollout.id)
            if rollout.status in TERMINAL_ROLLOUT and rollout.ended_at is not None:
                p.zadd(self._k("ended"), {rollout.id: rollout.ended_at})
                ended = True
            if attempt is not None:
                p.hset(self._ak(attempt.id), mapping=_attempt_fields(attempt))
                p.zrem(self._k("running"), attempt.id)
                p.hincrby(self._k("na"), _RUNNING, -1)
                p.hincrby(self._k("na"), json.dumps(attempt.status.value), 1)
        return ended

    async def _rollout_of(self, attempt_id: str) -> str:
        owner = await self._r.hget(self._ak(attempt_id), "rollout_id")
        if owner is None:
            raise q.attempt_not_found(attempt_id)
        return cast(str, json.loads(owner))

    async def _load_rollouts(self, ids: Sequence[str]) -> list[Rollout | None]:
        if not ids:
            return []
        pipe = self._r.pipeline(transaction=False)
        for rid in ids:
            pipe.hgetall(self._rk(rid))
        rows: list[dict[str, str]] = await pipe.execute()
        return [Rollout.model_validate(_decode(row)) if row else None for row in rows]

    async def _load_attempts(self, ids: Sequence[str]) -> list[Attempt | None]:
        if not ids:
            return []
        pipe = self._r.pipeline(transaction=False)
        for aid in ids:
            pipe.hgetall(self._ak(aid))
        rows: list[dict[str, str]] = await pipe.execute()
        return [Attempt.model_validate(_decode(row)) if row else None for row in rows]

    async def _rollout(self, rollout_id: str) -> Rollout:
        (rollout,) = await self._load_rollouts([rollout_id])
        if rollout is None:
            raise q.rollout_not_found(rollout_id)
        return rollout

    async def _attempt(self, attempt_id: str) -> Attempt:
        (attempt,) = await self._load_attempts([attempt_id])
        if attempt is None:
            raise q.attempt_not_found(attempt_id)
        return attempt

    async def _running_attempts(self, pipe: Any, rollout_ids: Sequence[str]) -> dict[str, Attempt]:
        """The running attempt of each rollout that has one (its last attempt), watched by ``pipe``."""
        if not rollout_ids:
            return {}
        reader = self._r.pipeline(transaction=False)
        for rid in rollout_ids:
            reader.lindex(self._rak(rid), -1)
        last: list[str | None] = await reader.execute()
        aids = [aid for aid in last if aid is not None]
        if not aids:
            return {}
        await pipe.watch(*(self._ak(a) for a in aids))
        attempts = await self._load_attempts(aids)
        return {a.rollout_id: a for a in attempts if a is not None and a.status is AttemptStatus.RUNNING}

    async def _ended(self, ids: list[str]) -> list[Rollout]:
        unique = list(dict.fromkeys(ids))
        pipe = self._r.pipeline(transaction=False)
        for rid in unique:
            pipe.hget(self._rk(rid), "status")
        statuses: list[str | None] = await pipe.execute()
        terminal = {json.dumps(s.value) for s in TERMINAL_ROLLOUT}
        done = [rid for rid, s in zip(unique, statuses, strict=True) if s in terminal]
        by_id = {r.id: r for r in await self._load_rollouts(done) if r is not None}
        return q.unshared([by_id[i] for i in ids if i in by_id])

    async def _expire(self, t: float) -> int:
        """Time out running attempts past their deadline; one range query when there are none.

        Callers in this process expire one at a time (the others wait, then find nothing due), and
        each round ends up to ``_EXPIRE_BATCH`` attempts in one transaction."""
        running = self._k("running")
        if not await self._r.zrangebyscore(running, "-inf", repr(t), start=0, num=1):
            return 0
        expired = 0
        async with self._expire_lock:
            for _ in range(1000):  # bounded: every round ends or drops what it found
                due: list[str] = await self._r.zrangebyscore(running, "-inf", repr(t), start=0, num=_EXPIRE_BATCH)
                if not due:
                    break
                expired += await self._expire_batch(due, t)
        return expired

    async def _expire_batch(self, attempt_ids: list[str], t: float) -> int:
        reader = self._r.pipeline(transaction=False)
        for aid in attempt_ids:
            reader.hget(self._ak(aid), "rollout_id")
        owners: list[str | None] = await reader.execute()
        rollout_ids = list(dict.fromkeys(cast(str, json.loads(o)) for o in owners if o is not None))

        async def txn(pipe: Any) -> tuple[int, Writes]:
            await pipe.watch(*(self._rk(r) for r in rollout_ids), *(self._ak(a) for a in attempt_ids))
            rollouts = {r.id: r for r in await self._load_rollouts(rollout_ids) if r is not None}
            attempts = dict(zip(attempt_ids, await self._load_attempts(attempt_ids), strict=True))
            changes: list[tuple[RolloutStatus, Rollout, Attempt | None]] = []
            drop: list[str] = []  # in the running set but not running (pruned): never expire them again
            for aid, attempt in attempts.items():
                rollout = rollouts.get(attempt.rollout_id) if attempt is not None else None
                if attempt is None or rollout is None or attempt.status is not AttemptStatus.RUNNING:
                    drop.append(aid)
                    continue
                if attempt.deadline is None or attempt.deadline > t:
                    continue  # heartbeated since the range query
                before = rollout.status
                reason, message = expiry_reason(rollout.config, attempt, t)
                q.end_attempt(rollout, attempt, AttemptStatus.TIMED_OUT, reason, message, None, now())
                changes.append((before, rollout, attempt))

            def write(p: Any) -> bool:
                if drop:
                    p.zrem(self._k("running"), *drop)
                return self._write_changes(p, changes)

            return len(changes), write

        return await self._transact(txn)


def _counts(raw: dict[str, str]) -> dict[str, int]:
    """Counter hash (JSON status -> count) as the ``StoreStats`` dict, without zero entries."""
    out = {cast(str, json.loads(k)): int(v) for k, v in raw.items()}
    return {k: v for k, v in out.items() if v}
