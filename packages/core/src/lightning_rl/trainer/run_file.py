"""``lightning-rl train CONFIG``: one TOML or YAML file describes a whole run, for any algorithm.

The file names the agent, the tasks, the model and the algorithm with its options::

    agent = "my_agent:run"                 # module:function; the file's folder is importable
    model = "tiny"                         # optional: into the algorithm's ``model``
    run_dir = "runs/my_run"                # optional: into the algorithm's ``run_dir``
    store = "postgresql://host/db"         # optional: the algorithm's store (default: the run folder's SQLite)
    seed = 0                               # optional: into the algorithm's ``seed`` and the task functions
    warm_start = "my_agent:warm_start"     # optional: fn(model, out_dir, tasks, seed) -> trained model folder
    trainable = ["solver"]                 # optional: the roles that train (RL, SFT, DPO)
    train_tasks = "train.jsonl"            # JSON lines (a Task, or any value used as the task's input)
    val_tasks = "my_tasks:held_out"        # optional; or module:function -> tasks (given seed=, run_dir= if named)
    session = "my_agent:session"           # optional: fn() -> a (sync or async) context manager around the run

    [algorithm]
    name = "grpo"                          # any registered name: grpo, rloo, ppo, sft, dpo, apo
    steps = 20                             # every other key is a field of that algorithm's config
    [algorithm.backend]
    lr = 3e-4

Everything is checked before anything runs: an unknown key names the closest known one, a missing
file says where it was looked for, a bad value names its key and the expected type. ``--set
key=value`` overrides any key by its dotted path (``--set algorithm.backend.lr=1e-3``); values are
read as JSON when they parse (numbers, booleans, lists, ``null`` for None), else as text.

A ``module:function`` value other than ``agent`` may also be a table ``{ function = "module:function",
key = value, ... }``: the other keys are keyword arguments of the call, so ``--set warm_start.steps=5``
reaches the function too.

``session`` is for agents whose framework must be set up around training and torn down after it: a
plugin's ``instrument(...)``, clients that belong to an event loop. The function (given ``trainable=``
and ``config=`` when it names them) returns a context manager, entered before the warm start (which may
run the agent) and left after ``fit``. An async context manager is entered inside the event loop the
training runs in (``asyncio.run`` of ``fit_async``; the warm start then runs in a worker thread), so the
clients it opens live in the loop of the in-process runner and can be closed there.

The run folder is the one the algorithm writes (for the RL loop: ``config.json``, ``metrics.jsonl``,
``reward_curve.png``, ``store.sqlite``, ``checkpoints/``), plus ``warm_start/`` when the file asks
for one (as ``lightning-rl demo`` lays it out) and ``train_config.json``: the file as run, after
overrides.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import functools
import importlib
import inspect
import json
import sys
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_rl.algorithms.base import AlgorithmEntry, TrainResult, algorithm_names, get_algorithm
from lightning_rl.types import Task

__all__ = [
    "ConfigError",
    "RunPlan",
    "load_run_file",
    "load_function",
    "parse_overrides",
    "build_config",
    "run_plan",
    "masked",
]

_TOP_KEYS = (
    "agent",
    "train_tasks",
    "val_tasks",
    "model",
    "run_dir",
    "store",
    "seed",
    "warm_start",
    "trainable",
    "session",
    "algorithm",
)
_COMMON = ("model", "run_dir", "store", "seed")
"""Top-level keys copied into the algorithm's config (when it has such a field)."""


class ConfigError(ValueError):
    """The run file is wrong; the message names the key and what to write instead."""


@dataclass
class RunPlan:
    """A checked run file: everything ``run_plan`` needs, nothing started yet."""

    path: Path
    raw: dict[str, Any]
    """The file's content after ``--set`` overrides (written to ``train_config.json``)."""
    entry: AlgorithmEntry
    config: Any
    """The algorithm's config object, built and validated."""
    agent: Callable[..., Any]
    train_tasks: list[Task]
    val_tasks: list[Task]
    warm_start: Callable[..., Any] | None
    trainable: list[str] | None
    session: Callable[[], Any] | None = None
    """Returns the context manager entered around the warm start and ``fit`` (the ``session`` key)."""


# --- reading the file ---------------------------------------------------------------------------
def read_file(path: Path) -> dict[str, Any]:
    """Parse a ``.toml``, ``.yaml`` or ``.yml`` file into a dict."""
    if not path.is_file():
        raise ConfigError(f"config file {path} not found; give the path of a .toml or .yaml run file.")
    text = path.read_text()
    if path.suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:
            raise ConfigError(f"{path}: YAML needs pyyaml (pip install 'lightning-rl[train]'), or use TOML.") from exc
        try:
            data: Any = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys (agent, tasks, algorithm, ...).")
        return typing.cast(dict[str, Any], data)
    raise ConfigError(f"{path}: unknown config format {path.suffix!r}; use .toml, .yaml or .yml.")


def parse_overrides(items: Sequence[str]) -> list[tuple[list[str], Any]]:
    """``["algorithm.steps=3", "model=tiny"]`` -> ``[(["algorithm", "steps"], 3), (["model"], "tiny")]``."""
    out: list[tuple[list[str], Any]] = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: write key=value, e.g. --set algorithm.steps=3")
        try:
            value: Any = json.loads(text)
        except json.JSONDecodeError:
            value = text
        out.append(([part.strip() for part in key.split(".")], value))
    return out


def apply_overrides(raw: dict[str, Any], overrides: Sequence[tuple[list[str], Any]]) -> dict[str, Any]:
    """Set each dotted key, creating tables on the way (``null`` is None: an optional setting turned
    off, or a top-level key left out)."""
    for path, value in overrides:
        node = raw
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {'.'.join(path)}: {'.'.join(path[: i + 1])} is a value, not a table.")
            node = typing.cast(dict[str, Any], child)
        node[path[-1]] = value
    return raw


# --- dataclass configs from mappings ------------------------------------------------------------
def _unknown(key: str, known: Sequence[str], where: str) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}."
    return ConfigError(f"{where}{key}: unknown key; {hint}")


def build_config(cls: type[Any], data: Mapping[str, Any], where: str = "") -> Any:
    """``cls(**data)`` for a dataclass ``cls``, with each value checked against its field's type.

    Nested dataclass fields take tables. ``where`` prefixes keys in errors (``"algorithm."``).

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or the config's own check failed.
    """
    hints = _field_types(cls)
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise _unknown(key, fields, where)
        kwargs[key] = _convert(hints[key], value, f"{where}{key}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where.rstrip('.') or cls.__name__}: {exc}") from exc


def _field_types(cls: type[Any]) -> dict[str, Any]:
    """The resolved annotations of a dataclass; a name an annotation cannot resolve in its module (a
    forward reference nested in an alias, as in ``AIRPolicy``) leaves that part unchecked."""
    try:
        return typing.get_type_hints(cls)
    except NameError:
        pass
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        namespace = vars(sys.modules[klass.__module__])
        for name, annotation in klass.__dict__.get("__annotations__", {}).items():
            try:
                out[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation
            except NameError:
                out[name] = Any
    return out


def _describe(tp: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if tp in names:
        return names[tp]
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # an optional setting: its own error (a nested table's names the bad key)
            return _convert(options[0], value, key)
        errors: list[str] = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, key)
            except ConfigError as exc:
                errors.append(_describe(option))
                del exc
        raise ConfigError(f"{key}: expected {' or '.join(errors)}, got {value!r}.")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}: must be one of {', '.join(repr(a) for a in args)}; got {value!r}.")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a table of {tp.__name__} settings, got {value!r}.")
        return build_config(tp, typing.cast(Mapping[str, Any], value), f"{key}.")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}.")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}.")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}.")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}.")
        return value
    if origin in (list, Sequence) or tp is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}.")
        item = args[0] if args else Any
        return [_convert(item, v, f"{key}[{i}]") for i, v in enumerate(typing.cast(list[Any], value))]
    if origin is tuple:
        if not isinstance(value, list | tuple) or (args and len(typing.cast(Sequence[Any], value)) != len(args)):
            raise ConfigError(f"{key}: expected a list of {len(args)} values, got {value!r}.")
        items = typing.cast(Sequence[Any], value)
        return tuple(_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, items, strict=True)))
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a table, got {value!r}.")
        item = args[1] if len(args) == 2 else Any
        table = typing.cast(Mapping[str, Any], value)
        return {k: _convert(item, v, f"{key}.{k}") for k, v in table.items()}
    if origin is not None and getattr(origin, "__name__", "") == "Callable":
        raise ConfigError(f"{key}: a function cannot be given in a config file; set it in Python instead.")
    return value


# --- agents, tasks and hooks --------------------------------------------------------------------
def load_object(spec: str, key: str) -> Any:
    """Import ``module:attribute`` (the run file's folder is on ``sys.path``)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"{key}: {spec!r} is not module:function (e.g. 'my_agent:run').")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{key}: cannot import {module_name!r} ({exc}); modules are looked up in the config file's folder, "
            "the current directory and the installed packages."
        ) from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigError(f"{key}: module {module_name} has no {attribute!r}.") from None


def load_function(spec: Any, key: str) -> Callable[..., Any]:
    """The function of a ``module:function`` value, or of a table ``{ function = "module:function", ... }``
    with the table's other keys bound as keyword arguments (each checked against the signature)."""
    options: dict[str, Any] = {}
    if isinstance(spec, Mapping):
        options = dict(typing.cast(Mapping[str, Any], spec))
        if "function" not in options:
            raise ConfigError(
                f"{key}: a table needs function = 'module:function' (its other keys are the function's arguments)."
            )
        spec = options.pop("function")
    if not isinstance(spec, str):
        raise ConfigError(f"{key}: expected 'module:function' or a table with function = ..., got {spec!r}.")
    fn = load_object(spec, key)
    if not callable(fn):
        raise ConfigError(f"{key}: {spec} is not a function.")
    if options:
        params = inspect.signature(fn).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            for name in options:
                if name not in params:
                    raise _unknown(name, list(params), f"{key}.")
        fn = functools.partial(fn, **options)
    return typing.cast(Callable[..., Any], fn)


def _named(fn: Callable[..., Any], available: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``available`` that ``fn`` has a parameter for (and that a table did not bind)."""
    params = inspect.signature(fn).parameters
    bound = fn.keywords if isinstance(fn, functools.partial) else {}
    return {k: v for k, v in available.items() if k in params and k not in bound}


def _is_object_spec(spec: str, base: Path) -> bool:
    return ":" in spec and not (base / spec).exists() and not spec.endswith((".jsonl", ".json"))


def _as_task(item: Any, where: str) -> Task:
    if isinstance(item, Task):
        return item
    if isinstance(item, Mapping) and "input" in item:
        try:
            return Task.model_validate(item)
        except ValueError as exc:
            raise ConfigError(f"{where}: not a task ({exc}).") from exc
    return Task(input=item)


def load_tasks(spec: Any, base: Path, seed: int | None, key: str, run_dir: str | None = None) -> list[Task]:
    """Tasks from a JSON-lines / JSON file (relative to the run file) or a ``module:function`` (called
    with ``seed=`` and ``run_dir=`` when it names them: tasks may need files, as the SQL agent's database)."""
    if isinstance(spec, Mapping) or (isinstance(spec, str) and spec and _is_object_spec(spec, base)):
        fn = load_function(spec, key)
        items: Any = fn(**_named(fn, {"seed": seed if seed is not None else 0, "run_dir": run_dir}))
        return [_as_task(item, f"{key} item {i}") for i, item in enumerate(items)]
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"{key}: give a tasks file (.jsonl) or module:function, got {spec!r}.")
    path = base / spec
    if not path.is_file():
        raise ConfigError(f"{key}: tasks file {path} not found; paths are relative to the config file.")
    if path.suffix == ".jsonl":
        lines = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
        try:
            return [_as_task(json.loads(line), f"{path}:{n}") for n, line in lines]
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{key}: {path} line {exc.lineno}: not JSON ({exc.msg}).") from exc
    try:
        data: Any = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{key}: {path} is not JSON ({exc.msg}); use a JSON list or JSON lines.") from exc
    if not isinstance(data, list):
        raise ConfigError(f"{key}: {path} must hold a JSON list of tasks.")
    return [_as_task(item, f"{path} item {i}") for i, item in enumerate(typing.cast(list[Any], data))]


# --- the whole file -----------------------------------------------------------------------------
def load_run_file(path: str | Path, overrides: Sequence[str] = ()) -> RunPlan:
    """Read, override and check a run file; import the agent and load the tasks. Starts nothing.

    Raises:
        ConfigError: anything wrong with the file, named by its key.
    """
    path = Path(path)
    raw = apply_overrides(read_file(path), parse_overrides(overrides))
    raw = {key: value for key, value in raw.items() if value is not None}  # a top-level null: left out
    for key in raw:
        if key not in _TOP_KEYS:
            raise _unknown(key, _TOP_KEYS, "")
    base = path.resolve().parent
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))

    algorithm = raw.get("algorithm")
    if not isinstance(algorithm, Mapping) or "name" not in algorithm:
        raise ConfigError(
            f"algorithm: missing; add a table [algorithm] with name = one of {', '.join(algorithm_names())}."
        )
    options = dict(typing.cast(Mapping[str, Any], algorithm))
    name = options.pop("name")
    try:
        entry = get_algorithm(str(name))
    except KeyError as exc:
        raise ConfigError(f"algorithm.name: {exc.args[0]}") from None
    try:
        config_class = entry.config_class()
    except ImportError as exc:
        raise ConfigError(f"algorithm.name: {exc}") from exc
    field_names = {f.name for f in dataclasses.fields(config_class)}
    for key in _COMMON:
        if key in raw:
            if key in options:
                raise ConfigError(f"{key} is set twice (top level and algorithm.{key}); keep one.")
            if key not in field_names:
                raise ConfigError(f"{key}: algorithm {name!r} has no {key!r} setting; remove it.")
            options[key] = raw[key]
    config = build_config(config_class, _merge(entry.options, options), "algorithm.")
    backend: Any = getattr(config, "backend", None)
    backend_options = options.get("backend")
    if hasattr(backend, "seed") and not (isinstance(backend_options, Mapping) and "seed" in backend_options):
        backend.seed = int(getattr(config, "seed", 0))  # one seed for the run (as the demo does), unless set apart

    if "agent" not in raw:
        raise ConfigError("agent: missing; add agent = 'module:function' (the agent to train).")
    agent = load_object(str(raw["agent"]), "agent")
    if not callable(agent):
        raise ConfigError(f"agent: {raw['agent']} is not a function.")
    if "train_tasks" not in raw:
        raise ConfigError("train_tasks: missing; add train_tasks = 'train.jsonl' (or 'module:function').")
    seed = getattr(config, "seed", raw.get("seed"))
    run_dir = getattr(config, "run_dir", None)
    train = load_tasks(raw["train_tasks"], base, seed, "train_tasks", run_dir)
    if not train:
        raise ConfigError("train_tasks: no tasks; training needs at least one.")
    val = load_tasks(raw["val_tasks"], base, seed, "val_tasks", run_dir) if "val_tasks" in raw else []

    warm = None
    if raw.get("warm_start"):
        warm = load_function(raw["warm_start"], "warm_start")
        if "model" not in field_names:
            raise ConfigError(f"warm_start: algorithm {name!r} has no model to warm-start; remove it.")
    trainable = raw.get("trainable")
    if trainable is not None:
        if isinstance(trainable, str):
            trainable = [trainable]
        if not isinstance(trainable, list) or not all(isinstance(r, str) for r in typing.cast(list[Any], trainable)):
            raise ConfigError(f"trainable: expected a role name or a list of them, got {trainable!r}.")
        if "trainable" not in inspect.signature(entry.load()).parameters:
            raise ConfigError(f"trainable: algorithm {name!r} trains no roles; remove it.")
    session = None
    if raw.get("session"):
        session = load_function(raw["session"], "session")
    roles = typing.cast(list[str] | None, trainable)
    return RunPlan(path, raw, entry, config, agent, train, val, warm, roles, session)


_SECRET_SUFFIXES = ("api_key", "token", "password", "secret")


def masked(value: Any) -> Any:
    """``value`` with every setting whose name ends in api_key / token / password / secret shown as ``***``:
    a run file may hold a key, but the copies written to the run folder or printed must not."""
    if isinstance(value, Mapping):
        items = typing.cast(Mapping[str, Any], value).items()
        return {k: "***" if v and str(k).lower().endswith(_SECRET_SUFFIXES) else masked(v) for k, v in items}
    if isinstance(value, list):
        return [masked(v) for v in typing.cast(list[Any], value)]
    return value


def _merge(defaults: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    for key, value in options.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(typing.cast(Mapping[str, Any], out[key]), typing.cast(Mapping[str, Any], value))
        else:
            out[key] = value
    return out


def run_plan(plan: RunPlan) -> TrainResult:
    """Warm-start if asked (reusing a finished one in the run folder), then ``fit``, inside the session
    when the file names one; returns the algorithm's result.

    Raises:
        ConfigError: the session returned no context manager, or an async one for an algorithm without
            ``fit_async``.
    """
    run_dir = Path(getattr(plan.config, "run_dir", "runs/latest"))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train_config.json").write_text(json.dumps(masked(plan.raw), indent=2, default=str))
    if plan.session is None:
        _warm_start(plan, run_dir)
        return _algorithm(plan).fit(plan.agent, plan.train_tasks, plan.val_tasks)
    session = plan.session(**_named(plan.session, {"trainable": plan.trainable, "config": plan.config}))
    if isinstance(session, contextlib.AbstractAsyncContextManager):
        if not hasattr(plan.entry.load(), "fit_async"):
            raise ConfigError(
                f"session: {plan.raw['session']} gives an async context manager, but algorithm {plan.entry.name!r} "
                "has no fit_async to run inside its event loop; give a sync context manager instead."
            )
        return asyncio.run(_fit_in_async_session(plan, run_dir, typing.cast(Any, session)))
    if not isinstance(session, contextlib.AbstractContextManager):
        raise ConfigError(
            f"session: {plan.raw['session']} returned {type(session).__name__}, not a context manager; "
            "return one (e.g. from a @contextlib.contextmanager or @contextlib.asynccontextmanager function)."
        )
    with typing.cast(contextlib.AbstractContextManager[Any], session):
        _warm_start(plan, run_dir)
        return _algorithm(plan).fit(plan.agent, plan.train_tasks, plan.val_tasks)


async def _fit_in_async_session(
    plan: RunPlan, run_dir: Path, session: contextlib.AbstractAsyncContextManager[Any]
) -> TrainResult:
    async with session:
        # a warm start may start its own event loop (one that runs the agent): a worker thread has none
        await asyncio.to_thread(_warm_start, plan, run_dir)
        result: TrainResult = await _algorithm(plan).fit_async(plan.agent, plan.train_tasks, plan.val_tasks)
        return result


def _warm_start(plan: RunPlan, run_dir: Path) -> None:
    """Point ``config.model`` at the warm-started model, training it unless the run folder has one."""
    if plan.warm_start is None:
        return
    config = plan.config
    out_dir = run_dir / "warm_start"
    if (out_dir / "config.json").exists():
        print(f"reusing the warm start in {out_dir}", flush=True)
    else:
        seed = getattr(config, "seed", 0)
        out_dir = Path(plan.warm_start(model=config.model, out_dir=out_dir, tasks=plan.train_tasks, seed=seed))
    config.model = str(out_dir)


def _algorithm(plan: RunPlan) -> Any:
    cls = plan.entry.load()
    return cls(plan.config, trainable=plan.trainable) if plan.trainable is not None else cls(plan.config)
