"""Redis store: a shared store on a Redis server, for teams that already run one.

Why it looks like this:

* **Two atomic paths.** The two hot spots where many clients meet run as **Lua scripts**, which Redis
  executes one at a time with nothing in between: ``claim`` pops waiting rollouts off one sorted
  set and opens their attempts in the same script (two claimers can never take one rollout, and
  they never retry against each other), and ``add_spans`` checks its attempts and writes each span
  only if its ``(trace_id, span_id)`` is new (idempotent even when two clients send one batch at
  once). Everything else (finish, heartbeat, cancel, expiry, enqueue, prune) changes one rollout or a
  few at a time and runs as an **optimistic transaction** (``WATCH`` the keys, read, decide in
  Python, ``MULTI``/``EXEC``; started over if a watched key changed), so *what* happens is decided
  by ``store._rules``, the very functions the other backends call.
* **Few round trips.** redis-py provides the connection pool and the protocol; the store sends its
  commands in batches on one connection (``WATCH`` with the reads it guards, then ``MULTI`` … ``EXEC``
  with all the writes), so a finish is three round trips and a claim or a span batch one.
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
  acknowledged, ``everysec`` up to about a second of writes when the machine (not just the server
  process) is lost (see docs/stores.md). ``open`` reads the server's settings and logs a warning when
  it keeps nothing on disk or may evict keys when full (``maxmemory-policy`` other than ``noeviction``).
* **Standalone Redis only**: the scripts build key names from the prefix, which Redis Cluster does
  not allow. Clocks come from the caller (``time.time()``), as in the other backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from lightning_rl.errors import InvalidRequestError, LightningError, StoreUnavailableError
from lightning_rl.store import _rules as rules
from lightning_rl.store._core import AttemptChange, RolloutChange, RolloutQuery, SpanQuery, StoreCore
from lightning_rl.store._spanjson import dump_span, span_key
from lightning_rl.store.base import DEFAULT_HEARTBEAT_TIMEOUT_S, now
from lightning_rl.types import (
    TERMINAL_ROLLOUT,
    Attempt,
    AttemptStatus,
    Claim,
    Resources,
    Rollout,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
    new_gateway_key,
    new_id,
)

try:
    import redis.asyncio as aioredis
    from redis.exceptions import NoScriptError, RedisError, ResponseError
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("RedisStore needs redis-py: install it with `pip install 'lightning-rl[redis]'`.") from exc

__all__ = ["RedisStore", "DEFAULT_URL", "DEFAULT_PREFIX"]

DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX: Final = "lightning:"
_RETRIES: Final = 200
"""Optimistic transactions started over this often before giving up (each conflict means another
client changed the same rollout meanwhile, so someone makes progress every time)."""
_EXPIRE_BATCH: Final = 100
"""Overdue attempts ended in one transaction."""
_POOL_WAIT_S: Final = 60.0
"""How long a call waits for a free connection before it reports the store unavailable."""

_log = logging.getLogger(__name__)
T = TypeVar("T")
Command = tuple[str | int | float, ...]

_RUNNING = json.dumps(AttemptStatus.RUNNING.value)
_TERMINAL = frozenset(json.dumps(s.value) for s in TERMINAL_ROLLOUT)
_ROLLOUT_MUTABLE = ("status", "attempt_count", "updated_at", "ended_at", "final_reward", "error")

# --------------------------------------------------------------------------------------------
# Lua scripts (ARGV[1] is the key prefix; values are JSON text, as stored)
# --------------------------------------------------------------------------------------------

_CLAIM_LUA = """
local p, n, worker, t, worker_tmo, check = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if check == '1' and #redis.call('ZRANGEBYSCORE', p .. 'running', '-inf', t, 'LIMIT', 0, 1) > 0 then
  return -1
end
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
    local aid, gkey = ARGV[5 + 2 * i], ARGV[6 + 2 * i]
    local number = redis.call('HINCRBY', rkey, 'attempt_count', 1)
    redis.call('HSET', rkey, 'status', '"running"', 'updated_at', t)
    -- attempt_timeout and attempt_deadline of store._rules, on the values enqueue stored for them
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
"""Take up to n waiting rollouts, oldest first, and open an attempt on each (ARGV[7..]: attempt id
and JSON gateway key per slot). Stale queue entries (a rollout no longer waiting) are dropped. With
ARGV[6] = '1' it first answers -1, claiming nothing, if an attempt is overdue: the caller expires
(which may requeue rollouts) and claims again, as every backend expires before it claims."""

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


class _Script:
    """A Lua script run by ``EVALSHA``, loaded with ``EVAL`` the first time a server lacks it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()


_CLAIM = _Script(_CLAIM_LUA)
_ADD_SPANS = _Script(_ADD_SPANS_LUA)
_ADD_RESOURCES = _Script(_ADD_RESOURCES_LUA)


# --------------------------------------------------------------------------------------------
# Encoding: hash fields hold JSON values
# --------------------------------------------------------------------------------------------


def _pairs(flat: Sequence[str]) -> dict[str, str]:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


def _decode(flat: Sequence[str]) -> dict[str, Any]:
    return {flat[i]: json.loads(flat[i + 1]) for i in range(0, len(flat), 2) if not flat[i].startswith("_")}


def _rollout_from(flat: Sequence[str]) -> Rollout | None:
    return Rollout.model_validate(_decode(flat)) if flat else None


def _attempt_from(flat: Sequence[str]) -> Attempt | None:
    return Attempt.model_validate(_decode(flat)) if flat else None


def _fields(data: dict[str, Any]) -> list[str]:
    """A model dump as ``HSET`` arguments: field, JSON value, field, JSON value, ..."""
    return [item for k, v in data.items() for item in (k, json.dumps(v))]


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


def _counts(flat: Sequence[str]) -> dict[str, int]:
    """Counter hash (JSON status -> count) as the ``StoreStats`` dict, without zero entries."""
    out = {cast(str, json.loads(k)): int(v) for k, v in _pairs(flat).items()}
    return {k: v for k, v in out.items() if v}


class _Link:
    """One pooled connection; ``run`` sends a batch of commands and reads every reply (one round trip)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.watching = False

    async def run(self, *commands: Command) -> list[Any]:
        await self.conn.send_packed_command(self.conn.pack_commands(commands))
        replies: list[Any] = []
        error: ResponseError | None = None
        for _ in commands:
            try:
                replies.append(await self.conn.read_response())
            except ResponseError as exc:  # an error reply: read the rest so the connection stays in step
                if not isinstance(exc, NoScriptError) or len(commands) > 1:
                    error = error or exc
                replies.append(exc)
        if error is not None:
            raise error
        return replies

    async def watch(self, keys: Sequence[str], *reads: Command) -> list[Any]:
        """``WATCH keys`` and the reads it guards, in one round trip; returns the reads' replies."""
        self.watching = True
        return (await self.run(("WATCH", *keys), *reads))[1:]

    async def script(self, script: _Script, args: Sequence[str | int | float]) -> Any:
        (reply,) = await self.run(("EVALSHA", script.sha, 0, *args))
        if isinstance(reply, NoScriptError):
            (reply,) = await self.run(("EVAL", script.text, 0, *args))
        return reply


Body = Callable[[_Link], Awaitable[tuple[T, list[Command], bool]]]
"""A transaction: WATCHes and reads on the link, returns (result, writes, whether they end a rollout)."""


class RedisStore(StoreCore):
    """A store on a Redis server (see the module docstring). Create it with ``await RedisStore.open(url)``."""

    def __init__(self, pool: aioredis.BlockingConnectionPool, prefix: str, poll_s: float) -> None:
        """Use ``RedisStore.open``; this only records the settings."""
        super().__init__()
        # redis-py's types are partial; the store only takes connections from the pool and hands them back.
        self._pool: Any = pool
        self._p = prefix
        self._poll_s = poll_s
        self._closed = False
        self._expire_lock = asyncio.Lock()
        self.server_settings: dict[str, str] = {}
        """The server's ``appendonly``, ``appendfsync``, ``save`` and ``maxmemory-policy`` as read at
        open (empty if the server does not allow ``CONFIG GET``)."""

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
            max_connections: Most connections used at once (callers beyond wait for one).
        """
        if max_connections < 1:
            raise InvalidRequestError(f"max_connections must be >= 1, got {max_connections}.")
        redis_url, chosen = _parse_url(url, prefix)
        pool = aioredis.BlockingConnectionPool.from_url(
            redis_url, max_connections=max_connections, timeout=_POOL_WAIT_S, decode_responses=True
        )
        store = cls(pool, chosen, poll_s)
        try:
            meta = store._k("meta")
            _, version = await store._read(
                ("HSETNX", meta, "schema_version", str(rules.LAYOUT_VERSION)), ("HGET", meta, "schema_version")
            )
            rules.check_layout(version, f"Redis store under prefix {chosen!r}", "another prefix")
            await store._read_settings()
        except BaseException:
            await store.close()
            raise
        return store

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self._p!r})"

    @property
    def prefix(self) -> str:
        """The prefix of every key this store writes."""
        return self._p

    async def _read_settings(self) -> None:
        """Read the server settings that decide whether acknowledged writes can be lost, and warn."""
        names = ("appendonly", "appendfsync", "save", "maxmemory-policy")
        try:
            replies = await self._read(*(("CONFIG", "GET", name) for name in names))
        except StoreUnavailableError:  # CONFIG is often disabled on managed servers: nothing to check then
            return
        for flat in replies:
            self.server_settings.update(_pairs(flat))
        settings = self.server_settings
        if settings.get("appendonly") != "yes":
            _log.warning(
                "the Redis server keeps no append-only file (appendonly %s, save %r): acknowledged writes are lost "
                "if it crashes. Set appendonly yes and appendfsync always (or everysec) for a durable store.",
                settings.get("appendonly"),
                settings.get("save"),
            )
        policy = settings.get("maxmemory-policy", "noeviction")
        if policy != "noeviction":
            _log.warning(
                "the Redis server's maxmemory-policy is %s: when it runs out of memory it deletes keys, including "
                "the store's rollouts and spans. Set maxmemory-policy noeviction (writes then fail instead).",
                policy,
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

    def _due(self, t: float) -> Command:
        """The command that finds one overdue attempt, if any (sent along with an operation's reads)."""
        return ("ZRANGEBYSCORE", self._k("running"), "-inf", repr(t), "LIMIT", 0, 1)

    # --- primitives -------------------------------------------------------------------------
    async def _insert_rollouts(self, requests: list[RolloutRequest]) -> list[Rollout]:
        keys = [self._rk(rid) for rid in dict.fromkeys(r.id for r in requests)]

        async def txn(link: _Link) -> tuple[list[Rollout], list[Command], bool]:
            rows = await link.watch(keys, *(("HGETALL", k) for k in keys))
            found = {r.id: r for r in map(_rollout_from, rows) if r is not None}
            fresh = rules.plan_enqueue(requests, found, now())
            writes: list[Command] = []
            if fresh:
                (last,) = await link.run(("INCRBY", self._k("rseq"), len(fresh)))
                for i, r in enumerate(fresh):
                    r.seq = int(last) - len(fresh) + 1 + i
                    hb = r.config.heartbeat_timeout_s
                    hidden = ["_hb", _float_json(hb if hb is not None else DEFAULT_HEARTBEAT_TIMEOUT_S)]
                    hidden += ["_tmo", _float_json(r.config.timeout_s)]
                    writes.append(("HSET", self._rk(r.id), *_fields(r.model_dump(mode="json")), *hidden))
                by_seq = [item for r in fresh for item in (r.seq, r.id)]
                writes.append(("ZADD", self._k("rollouts"), *by_seq))
                writes.append(("ZADD", self._k("waiting"), *by_seq))
                writes.append(("HINCRBY", self._k("nr"), json.dumps(RolloutStatus.QUEUED.value), len(fresh)))
            return [found[r.id] for r in requests], writes, False

        return await self._transact(txn)

    async def _claim(self, worker_id: str, n: int, timeout_s: float | None) -> list[Claim]:
        slots: list[str] = []
        for _ in range(n):
            slots += [new_id("at-"), json.dumps(new_gateway_key())]
        check = "1"
        while True:
            t = now()
            args = [self._p, n, json.dumps(worker_id), json.dumps(t), _float_json(timeout_s), check, *slots]
            async with self._link() as link:
                rows = await link.script(_CLAIM, args)
            if rows != -1:
                break
            await self._expire(t)  # an attempt was overdue: expire first (it may requeue a rollout)
            check = "0"
        return [
            Claim(rollout=Rollout.model_validate(_decode(r)), attempt=Attempt.model_validate(_decode(a)))
            for r, a in cast(list[list[list[str]]], rows)
        ]

    async def _update_attempt(self, attempt_id: str, change: AttemptChange) -> tuple[Rollout, Attempt]:
        t = now()
        due, owner = await self._read(self._due(t), ("HGET", self._ak(attempt_id), "rollout_id"))
        if due:
            await self._expire(t)
        if owner is None:
            raise rules.attempt_not_found(attempt_id)
        rkey, akey = self._rk(cast(str, json.loads(owner))), self._ak(attempt_id)

        async def txn(link: _Link) -> tuple[tuple[Rollout, Attempt], list[Command], bool]:
            rrow, arow = await link.watch([rkey, akey], ("HGETALL", rkey), ("HGETALL", akey))
            rollout, attempt = _rollout_from(rrow), _attempt_from(arow)
            if rollout is None or attempt is None:  # pruned meanwhile
                raise rules.attempt_not_found(attempt_id)
            before = rollout.status
            change(rollout, attempt)
            writes, ends = self._changes([(before, rollout, attempt)])
            return (rollout, attempt), writes, ends

        return await self._transact(txn)

    async def _update_rollouts(self, ids: list[str], change: RolloutChange) -> list[Rollout]:
        unique = list(dict.fromkeys(ids))
        keys = [self._rk(rid) for rid in unique]

        async def txn(link: _Link) -> tuple[list[Rollout], list[Command], bool]:
            rows = await link.watch(
                keys, *(("HGETALL", k) for k in keys), *(("LINDEX", self._rak(r), -1) for r in unique)
            )
            rollouts: dict[str, Rollout] = {}
            for rid, row in zip(unique, rows[: len(unique)], strict=True):
                rollout = _rollout_from(row)
                if rollout is None:
                    raise rules.rollout_not_found(rid)
                rollouts[rid] = rollout
            last = dict(zip(unique, rows[len(unique) :], strict=True))
            aids = [last[r] for r in unique if last[r] is not None and rollouts[r].status is RolloutStatus.RUNNING]
            running: dict[str, Attempt] = {}
            if aids:
                akeys = [self._ak(a) for a in aids]
                for row in await link.watch(akeys, *(("HGETALL", k) for k in akeys)):
                    attempt = _attempt_from(row)
                    if attempt is not None and attempt.status is AttemptStatus.RUNNING:
                        running[attempt.rollout_id] = attempt
            changed: list[tuple[RolloutStatus, Rollout, Attempt | None]] = []
            for rid in unique:
                rollout, attempt = rollouts[rid], running.get(rid)
                before = rollout.status
                if change(rollout, attempt):
                    changed.append((before, rollout, attempt))
            writes, ends = self._changes(changed)
            return [rollouts[rid] for rid in ids], writes, ends

        return await self._transact(txn)

    async def _select_rollouts(self, query: RolloutQuery) -> list[Rollout]:
        await self._expire_due()
        offset, limit = query.offset, query.limit
        if query.ids is not None:
            ids = list(query.ids)
            if query.statuses is not None:  # statuses first: waiting for a group reads few whole rollouts
                wanted = {json.dumps(s.value) for s in query.statuses}
                statuses = await self._read(*(("HGET", self._rk(r), "status") for r in ids))
                ids = [rid for rid, s in zip(ids, statuses, strict=True) if s in wanted]
            found = [r for r in await self._rollouts(ids) if r is not None]
            found.sort(key=lambda r: r.seq)
            return [r for r in found if query.matches(r)][offset : offset + limit]
        if query.statuses is None and query.group_id is None and query.mode is None:
            (page,) = await self._read(("ZRANGE", self._k("rollouts"), offset, offset + limit - 1))
            return [r for r in await self._rollouts(page) if r is not None]
        found: list[Rollout] = []
        skip, start, chunk = offset, 0, 1000
        while len(found) < limit:
            (some,) = await self._read(("ZRANGE", self._k("rollouts"), start, start + chunk - 1))
            if not some:
                break
            start += chunk
            matches = [r for r in await self._rollouts(some) if r is not None and query.matches(r)]
            found += matches[skip:]  # the skipped ones are never kept: an offset costs no memory
            skip = max(skip - len(matches), 0)
        return found[:limit]

    async def _get_attempt(self, attempt_id: str) -> Attempt | None:
        await self._expire_due()
        (row,) = await self._read(("HGETALL", self._ak(attempt_id)))
        return _attempt_from(row)

    async def _select_attempts(self, rollout_id: str) -> list[Attempt] | None:
        await self._expire_due()
        exists, aids = await self._read(("EXISTS", self._rk(rollout_id)), ("LRANGE", self._rak(rollout_id), 0, -1))
        if not exists:
            return None
        if not aids:
            return []
        rows = await self._read(*(("HGETALL", self._ak(a)) for a in aids))
        return [a for a in map(_attempt_from, rows) if a is not None]

    async def _insert_spans(self, spans: list[Span]) -> int:
        args: list[str] = [self._p]
        for span in spans:
            head, tail = _split_span(span)
            args += [span_key(span), span.attempt_id, json.dumps(span.rollout_id), head, tail]
        async with self._link() as link:
            result = int(await link.script(_ADD_SPANS, args))
        if result < 0:
            rules.check_span_targets([spans[-result - 1]], {})  # raises NotFoundError naming the span and attempt
        return result

    async def _select_spans(self, query: SpanQuery) -> list[Span]:
        aids: list[str]
        if query.attempt_id is not None:
            (owner,) = await self._read(("HGET", self._ak(query.attempt_id), "rollout_id"))
            inside = owner is not None and (query.rollout_id is None or json.loads(owner) == query.rollout_id)
            aids = [query.attempt_id] if inside else []
        elif query.rollout_id is not None:
            (aids,) = await self._read(("LRANGE", self._rak(query.rollout_id), 0, -1))
        else:
            (aids,) = await self._read(("ZRANGE", self._k("attempts"), 0, -1))
        if query.name is not None:
            texts = await self._span_texts(aids, 0, None)
            named = [s for s in map(Span.model_validate_json, texts) if s.name == query.name]
            return named[query.offset : query.offset + query.limit]
        return [Span.model_validate_json(text) for text in await self._span_texts(aids, query.offset, query.limit)]

    async def _span_texts(self, aids: list[str], offset: int, limit: int | None) -> list[str]:
        """Span JSON of ``aids`` in order, ``offset``/``limit`` applied across attempts by list lengths."""
        if not aids:
            return []
        lengths: list[int] = await self._read(*(("LLEN", self._sk(a)) for a in aids))
        end = sum(lengths) if limit is None else offset + limit  # the page, as positions across attempts
        ranges: list[Command] = []
        first = 0  # the position of the attempt's first span
        for aid, length in zip(aids, lengths, strict=True):
            lo, hi = max(offset - first, 0), min(end - first, length)
            if lo < hi:
                ranges.append(("LRANGE", self._sk(aid), lo, hi - 1))
            first += length
        if not ranges:
            return []
        return [text for chunk in await self._read(*ranges) for text in chunk]

    # --- resources --------------------------------------------------------------------------
    async def _insert_resources(self, make: Callable[[int], Resources]) -> Resources:
        res = make(1)  # the script assigns the version
        async with self._link() as link:
            res.version = int(await link.script(_ADD_RESOURCES, [self._p, res.model_dump_json(exclude={"version"})]))
        return res

    async def _select_resources(self, version: int | None) -> tuple[Resources | None, int]:
        (latest,) = await self._read(("HLEN", self._k("res")))
        wanted = int(latest) if version is None else version
        (data,) = await self._read(("HGET", self._k("res"), wanted)) if latest else (None,)
        if data is None:
            return None, int(latest)
        return Resources.model_validate({**json.loads(data), "version": wanted}), int(latest)

    # --- housekeeping -----------------------------------------------------------------------
    async def _delete_ended(self, older_than: float) -> int:
        (doomed,) = await self._read(("ZRANGEBYSCORE", self._k("ended"), "-inf", f"({older_than!r}"))
        pruned = 0
        for rid in doomed:
            pruned += await self._prune_one(rid, older_than)
        return pruned

    async def _prune_one(self, rid: str, older_than: float) -> int:
        rkey, rakey = self._rk(rid), self._rak(rid)

        async def txn(link: _Link) -> tuple[int, list[Command], bool]:
            row, aids = await link.watch([rkey, rakey], ("HGETALL", rkey), ("LRANGE", rakey, 0, -1))
            rollout = _rollout_from(row)
            if rollout is None or rollout.status not in TERMINAL_ROLLOUT or not (rollout.ended_at or 0) < older_than:
                return 0, [], False
            akeys, skeys = [self._ak(a) for a in aids], [self._sk(a) for a in aids]
            writes: list[Command] = [("DEL", rkey, rakey, *akeys, *skeys)]
            writes += [("ZREM", self._k(name), rid) for name in ("rollouts", "ended", "waiting")]
            writes.append(("HINCRBY", self._k("nr"), json.dumps(rollout.status.value), -1))
            if aids:
                replies = await link.watch(
                    [*akeys, *skeys], *(("HGETALL", k) for k in akeys), *(("LRANGE", k, 0, -1) for k in skeys)
                )
                attempts = [a for a in map(_attempt_from, replies[: len(aids)]) if a is not None]
                writes += [("HINCRBY", self._k("na"), json.dumps(a.status.value), -1) for a in attempts]
                writes += [("ZREM", self._k(name), *aids) for name in ("attempts", "running")]
                texts = [text for chunk in replies[len(aids) :] for text in chunk]
                if texts:
                    writes.append(("HDEL", self._k("sk"), *(span_key(Span.model_validate_json(t)) for t in texts)))
            return 1, writes, False

        return await self._transact(txn)

    async def _count(self) -> StoreStats:
        await self._expire_due()
        async with self._link() as link:  # MULTI/EXEC: one consistent snapshot of the counters
            replies = await link.run(
                ("MULTI",),
                ("HGETALL", self._k("nr")),
                ("HGETALL", self._k("na")),
                ("HLEN", self._k("sk")),
                ("HLEN", self._k("res")),
                ("EXEC",),
            )
        nr, na, spans, resources = replies[-1]
        return StoreStats(
            rollouts_by_status=_counts(nr),
            attempts_by_status=_counts(na),
            spans=int(spans),
            resources_versions=int(resources),
        )

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._pool.disconnect()

    # --- plumbing ---------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _link(self) -> AsyncGenerator[_Link]:
        """A connection from the pool; the driver's errors become ``StoreUnavailableError``."""
        if self._closed:
            raise StoreUnavailableError(f"{self!r} is closed; open a new RedisStore.")
        try:
            conn = await self._pool.get_connection()
        except RedisError as exc:
            raise _unavailable(exc) from exc
        link = _Link(conn)
        try:
            yield link
        except LightningError:  # the store's own error (not found, illegal transition): the connection is fine
            if link.watching:
                try:
                    await link.run(("UNWATCH",))
                except RedisError:
                    await conn.disconnect()
            raise
        except RedisError as exc:
            await conn.disconnect()  # the connection's state is unknown: never reuse it
            raise _unavailable(exc) from exc
        except BaseException:
            await conn.disconnect()  # cancelled mid-exchange: replies may still be on their way
            raise
        finally:
            await self._pool.release(conn)

    async def _read(self, *commands: Command) -> list[Any]:
        async with self._link() as link:
            return await link.run(*commands)

    async def _transact(self, body: Body[T]) -> T:
        """Run ``body`` (WATCH and reads on one connection, then the decision) and commit its writes
        with MULTI/EXEC; start over when a watched key changed meanwhile."""
        for attempt in range(_RETRIES):
            done = await self._try(body)
            if done is not None:
                return done[0]
            await asyncio.sleep(min(0.0005 * (attempt + 1), 0.02))  # a watched key changed: start over
        raise StoreUnavailableError(
            f"{self!r}: the same rollouts changed under {_RETRIES} tries in a row; retry the operation."
        )

    async def _try(self, body: Body[T]) -> tuple[T] | None:
        """One go of ``_transact``: ``(result,)`` once committed, None if a watched key changed.

        A body that reads in several steps can see a mix of states (a rollout read after a concurrent
        finish, its attempt before) and refuse it with a store error. So before such an error reaches
        the caller, an empty MULTI/EXEC checks the watched keys: if they changed, the error came from
        a torn read and the transaction starts over; if not, the error is real."""
        async with self._link() as link:
            try:
                result, writes, ends = await body(link)
            except LightningError:
                if not link.watching:
                    raise
                link.watching = False
                if (await link.run(("MULTI",), ("EXEC",)))[-1] is not None:
                    raise  # nothing changed under the reads: the error stands
                return None
            if not writes:
                if link.watching:
                    await link.run(("UNWATCH",))
                return (result,)
            replies = await link.run(("MULTI",), *writes, ("EXEC",))
        committed = replies[-1]
        if committed is None:
            return None
        failed = [r for r in committed if isinstance(r, RedisError)]
        if failed:
            raise _unavailable(failed[0])
        if ends:
            self._rollouts_ended()
        return (result,)

    def _changes(self, changes: Sequence[tuple[RolloutStatus, Rollout, Attempt | None]]) -> tuple[list[Command], bool]:
        """The writes of rollouts (and their attempts) moved on by ``end_attempt``/``cancel_rollout``,
        with the queue, running set, ended set and counters kept in step; and whether a rollout ended."""
        writes: list[Command] = []
        ended = False
        for before, rollout, attempt in changes:
            mutable = rollout.model_dump(mode="json", include=set(_ROLLOUT_MUTABLE))
            writes.append(("HSET", self._rk(rollout.id), *_fields(mutable)))
            if before is not rollout.status:
                writes.append(("HINCRBY", self._k("nr"), json.dumps(before.value), -1))
                writes.append(("HINCRBY", self._k("nr"), json.dumps(rollout.status.value), 1))
            if rollout.status is RolloutStatus.REQUEUED:
                writes.append(("ZADD", self._k("waiting"), rollout.seq, rollout.id))
            elif before in (RolloutStatus.QUEUED, RolloutStatus.REQUEUED):
                writes.append(("ZREM", self._k("waiting"), rollout.id))
            if rollout.status in TERMINAL_ROLLOUT and rollout.ended_at is not None:
                writes.append(("ZADD", self._k("ended"), rollout.ended_at, rollout.id))
                ended = True
            if attempt is not None:
                writes.append(("HSET", self._ak(attempt.id), *_fields(attempt.model_dump(mode="json"))))
            if attempt is not None and attempt.status is AttemptStatus.RUNNING:  # a heartbeat
                writes.append(("ZADD", self._k("running"), cast(float, attempt.deadline), attempt.id))
            elif attempt is not None:
                writes.append(("ZREM", self._k("running"), attempt.id))
                writes.append(("HINCRBY", self._k("na"), _RUNNING, -1))
                writes.append(("HINCRBY", self._k("na"), json.dumps(attempt.status.value), 1))
        return writes, ended

    async def _rollouts(self, ids: Sequence[str]) -> list[Rollout | None]:
        if not ids:
            return []
        return [_rollout_from(row) for row in await self._read(*(("HGETALL", self._rk(r)) for r in ids))]

    async def _expire_due(self) -> None:
        """Expire before a read, as every backend does; one range query when nothing is due."""
        t = now()
        (due,) = await self._read(self._due(t))
        if due:
            await self._expire(t)

    async def _expire(self, t: float) -> int:
        """Time out running attempts past their deadline. Callers in this process expire one at a
        time (the others wait, then find nothing due); each round ends up to ``_EXPIRE_BATCH``."""
        expired = 0
        async with self._expire_lock:
            for _ in range(1000):  # bounded: every round ends or drops what it found
                (due,) = await self._read(
                    ("ZRANGEBYSCORE", self._k("running"), "-inf", repr(t), "LIMIT", 0, _EXPIRE_BATCH)
                )
                if not due:
                    break
                expired += await self._expire_batch(due, t)
        return expired

    async def _expire_batch(self, attempt_ids: list[str], t: float) -> int:
        akeys = [self._ak(a) for a in attempt_ids]

        async def txn(link: _Link) -> tuple[int, list[Command], bool]:
            rows = await link.watch(akeys, *(("HGETALL", k) for k in akeys))
            attempts = dict(zip(attempt_ids, map(_attempt_from, rows), strict=True))
            rids = list(dict.fromkeys(a.rollout_id for a in attempts.values() if a is not None))
            rkeys = [self._rk(r) for r in rids]
            rollouts = {
                r.id: r for r in map(_rollout_from, await link.watch(rkeys, *(("HGETALL", k) for k in rkeys))) if r
            }
            changes: list[tuple[RolloutStatus, Rollout, Attempt | None]] = []
            drop: list[str] = []  # in the running set but not running (pruned): never look at them again
            for aid, attempt in attempts.items():
                rollout = rollouts.get(attempt.rollout_id) if attempt is not None else None
                if attempt is None or rollout is None or attempt.status is not AttemptStatus.RUNNING:
                    drop.append(aid)
                    continue
                if attempt.deadline is None or attempt.deadline > t:
                    continue  # heartbeated since the range query
                before = rollout.status
                rules.expire(rollout, attempt, t, now())
                changes.append((before, rollout, attempt))
            writes, ends = self._changes(changes)
            if drop:
                writes.append(("ZREM", self._k("running"), *drop))
            return len(changes), writes, ends

        return await self._transact(txn)


def _unavailable(exc: RedisError) -> StoreUnavailableError:
    return StoreUnavailableError(
        f"Redis store failed: {exc}; the operation was not applied (or, for a lost connection, may have been), "
        "retry it later: every write is idempotent or checked."
    )
