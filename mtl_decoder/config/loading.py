"""Loading a configuration: YAML file -> task files -> dotted ``key=value`` overrides -> checked dataclasses.

Unknown keys and bad values are errors naming the full dotted key and suggesting the closest valid one.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from mtl_decoder.config.kinds import SPLITS
from mtl_decoder.config.schema import ExperimentConfig
from mtl_decoder.config.task import TaskConfig
from mtl_decoder.errors import ConfigError, did_you_mean
from mtl_decoder.files import path_problem

# --------------------------------------------------------------------------------------------------
# Building dataclasses from plain dicts, with type coercion and key-naming errors.

MAX_INT = 10**15
"""The largest integer a config key takes: above any real count of steps, tokens or units, and exact as a float
(2**53 is about 9e15), so '1e30' is refused like '2.5' rather than read as 10**30."""


def _coerce(key: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null", "~"))
        if is_none and len(args) < len(typing.get_args(tp)):
            return None
        return _coerce(key, value, args[0])
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(key, f"expected a list, got {value!r}")
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(key, f"expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, (bool, list, dict)):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        try:
            if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
                number = int(value)
            else:
                number = float(value) if isinstance(value, (str, float)) else value
                if isinstance(number, float) and not number.is_integer():
                    raise ValueError
                number = int(number)  # YAML reads 1e3 as a string: accept it when it is a whole number
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(key, f"expected an integer, got {value!r}") from None
        if abs(number) > MAX_INT:  # 1e30 is a whole number, but no count or size of a run is that large
            raise ConfigError(key, f"expected an integer of at most {MAX_INT:.0e} in size, got {value!r}")
        return number
    if tp is float:
        if isinstance(value, (bool, list, dict)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        try:
            number = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string; float() takes it
        except (TypeError, ValueError):
            raise ConfigError(key, f"expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(key, f"expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return str(value)
    return value


def build(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a dict; errors name the full dotted key."""
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(prefix, f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in hints:
            dotted = [f"{prefix}.{n}" if prefix else n for n in names]
            raise ConfigError(full, f"unknown key{did_you_mean(full, dotted)}")
        kwargs[key] = _coerce(full, value, hints[key])
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{prefix}.{missing[0]}" if prefix else missing[0], "is required")
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise err.under(prefix) if prefix else err from None


# --------------------------------------------------------------------------------------------------
# YAML files, task files and overrides.


class UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a key given twice in one mapping.

    The safe loader, refusing a key given twice in one mapping (plain YAML keeps the last silently, so a second
    ``model:`` block would drop the first); a ``<<`` merge may still be overridden, as YAML means it."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: the base loader reports it
                continue
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key '{key}' is given twice, on lines {first + 1} and {key_node.start_mark.line + 1}; keep one",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep)


def read_yaml_text(text: str) -> Any:
    """YAML as plain data: the safe loader, with repeated keys refused (``UniqueKeyLoader``)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects


def _read_yaml(path: Path, what: str = "config file") -> dict[str, Any]:
    problem = path_problem(path)
    if problem:
        shown = f"{what} not found: {path}" if problem == "file not found" else f"{what} {path}: {problem}"
        raise ConfigError("", shown)
    try:
        data = read_yaml_text(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError("", f"{path}: not UTF-8 text ({err.reason} at byte {err.start + 1})") from None
    except OSError as err:
        raise ConfigError("", f"{what} {path}: cannot be read ({err.strerror})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError("", f"{where}: invalid YAML ({getattr(err, 'problem', err)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", f"{path}: expected a mapping at the top level")
    return data


def load_task_file(path: str | Path) -> dict[str, Any]:
    """A task YAML as a dict, with relative data paths made absolute against the task file's folder."""
    path = Path(path)
    task = _read_yaml(path, "task file")
    return _resolve_task_paths(task, path.parent)


def load_task(path: str | Path) -> TaskConfig:
    """One task file, validated (errors name tasks.NAME.field); its data files are not opened."""
    task = load_task_file(path)
    name = task.get("name")
    if not isinstance(name, str):
        raise ConfigError("name", f"{path}: a task file needs a name")
    return build(TaskConfig, task, f"tasks.{name}")


def _resolve_task_paths(task: dict[str, Any], base: Path) -> dict[str, Any]:
    data = task.get("data")
    if isinstance(data, dict) and not data.get("hub_id"):
        for split in SPLITS:
            value = data.get(split)
            if isinstance(value, str) and value and not Path(value).is_absolute():
                data[split] = str((base / value).resolve())
    return task


def _tasks_from_yaml(entries: Any, base: Path) -> dict[str, dict[str, Any]]:
    if isinstance(entries, str):  # one task file
        entries = [entries]
    if isinstance(entries, dict):  # name -> path or inline mapping
        entries = [dict(v, name=k) if isinstance(v, dict) else v for k, v in entries.items()]
    if not isinstance(entries, list):
        raise ConfigError("tasks", "expected a list of task files or task mappings")
    tasks: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            task_path = base / entry if not Path(entry).is_absolute() else Path(entry)
            problem = path_problem(task_path)
            if problem:
                shown = "task file not found" if problem == "file not found" else f"task file {problem}"
                raise ConfigError(f"tasks[{i}]", f"{shown}: {task_path}")
            task = load_task_file(task_path)
        elif isinstance(entry, dict):
            task = _resolve_task_paths(dict(entry), base)
        else:
            raise ConfigError(f"tasks[{i}]", f"expected a task file path or mapping, got {entry!r}")
        name = task.get("name")
        if not isinstance(name, str):
            raise ConfigError(f"tasks[{i}].name", "is required")
        if name in tasks:
            raise ConfigError(f"tasks.{name}", "is listed twice")
        tasks[name] = task
    return tasks


def _resolve_trunk_path(tree: dict[str, Any], base: Path) -> None:
    """Resolve model.trunk.pretrained: a local path becomes absolute, a hub id stays.

    model.trunk.pretrained: a local folder or file (relative to the config file, or to the current folder)
    becomes an absolute path; anything else is a hub id and stays as written."""
    trunk = tree.get("model", {}).get("trunk") if isinstance(tree.get("model"), dict) else None
    value = trunk.get("pretrained") if isinstance(trunk, dict) else None
    if not isinstance(value, str) or not value or Path(value).is_absolute():
        return
    for root in (base, Path.cwd()):
        candidate = (root / value).expanduser()
        if candidate.exists():
            trunk["pretrained"] = str(candidate.resolve())
            return


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b.c=value' -> (['a', 'b', 'c'], parsed value); the value is read as YAML.

    YAML 1.1 reads ``1e-3`` as a string; the typed fields coerce it (``training.lr=1e-3`` is the float 0.001).
    """
    if "=" not in text:
        raise ConfigError(text, "an override must look like key=value (e.g. model.d_model=64)")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(key, "malformed key")
    try:
        value = read_yaml_text(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_override(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    node = tree
    if parts == ["tasks"]:  # tasks=a.yaml,b.yaml or tasks=[a.yaml]: the task list itself, paths from here
        entries = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        tree["tasks"] = _tasks_from_yaml(entries, Path.cwd())
        return
    if parts[0] == "tasks" and len(parts) > 1:
        tasks = tree["tasks"]
        if parts[1] not in tasks:
            raise ConfigError(".".join(parts[:2]), f"no such task{did_you_mean(parts[1], tasks)}")
        if len(parts) == 2:
            raise ConfigError(".".join(parts), "name a task field, e.g. tasks.NAME.data.train=PATH")
        node, parts = tasks[parts[1]], parts[2:]
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), "is not a section")
        node = child
    node[parts[-1]] = value


def load_config(
    path: str | Path | None, overrides: list[str] = (), base: dict[str, Any] | None = None
) -> ExperimentConfig:
    """Read an experiment YAML (or start from ``base``), apply ``key=value`` overrides, validate."""
    tree: dict[str, Any] = copy.deepcopy(base or {})
    if path is not None:
        path = Path(path)
        tree.update(_read_yaml(path))
        tree["tasks"] = _tasks_from_yaml(tree.get("tasks", []), path.parent)
    elif isinstance(tree.get("tasks"), list):
        tree["tasks"] = _tasks_from_yaml(tree["tasks"], Path.cwd())
    tree.setdefault("tasks", {})
    for text in overrides:
        parts, value = parse_override(text)
        apply_override(tree, parts, value)
    for task in tree["tasks"].values():  # paths given as overrides are relative to where the user is
        _resolve_task_paths(task, Path.cwd())
    _resolve_trunk_path(tree, Path(path).parent if path is not None else Path.cwd())
    tasks = {name: build(TaskConfig, task, f"tasks.{name}") for name, task in tree["tasks"].items()}
    return build(ExperimentConfig, {**tree, "tasks": tasks})


def config_from_dict(data: dict[str, Any]) -> ExperimentConfig:
    """Rebuild a saved (resolved) config: its tasks are a list of inline mappings with absolute paths."""
    tree = dict(data)
    tree["tasks"] = {t["name"]: build(TaskConfig, t, f"tasks.{t['name']}") for t in tree.get("tasks", [])}
    return build(ExperimentConfig, tree)


def parse_task_names(tasks: str | Iterable[str] | None, known: list[str], flag: str = "--tasks") -> list[str] | None:
    """Task names from a string or a list, checked against the known ones.

    Task names from a comma-separated string or a list, checked against ``known``, in the given order without
    repeats; None when ``tasks`` is None (meaning: all)."""
    if tasks is None:
        return None
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else [str(t).strip() for t in tasks]
    names = list(dict.fromkeys(n for n in names if n))
    if not names:
        raise ConfigError("", f"{flag}: no task names given (tasks: {', '.join(known)})")
    for name in names:
        if name not in known:
            raise ConfigError(
                "", f"{flag}: unknown task '{name}'{did_you_mean(name, known)}; tasks: {', '.join(known)}"
            )
    return names
