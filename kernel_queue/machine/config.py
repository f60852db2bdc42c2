"""The system service's config file: the machine's quota, per-user rules and listing privacy.

`load(path)` reads and checks `/etc/kernel-queue/machine.json` (see
`etc/kernel-queue/machine.json`) and returns a `SystemConfig`; every mistake is a `ConfigError`
whose sentence names the key, what is wrong and the fix. Users and groups in `users` are looked
up (pwd, grp) when the file is loaded, so a typo stops the service instead of silently applying
no rule. Called by `__main__` before the event loop starts; nothing here runs at import.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_queue import admission, quantities
from kernel_queue.errors import ConfigError
from kernel_queue.machine import protocol

DEFAULT_PATH = Path("/etc/kernel-queue/machine.json")
PRIVACY = ("names", "counts")
EVERYONE = "*"
"""The `users` key whose rule applies to whoever no other entry names."""
GROUP_PREFIX = "group:"

_TOP = {
    "gpus": 'a list of GPU ids such as ["0", "1"], or a count',
    "pretend": "true or false",
    "cpu": 'a CPU quantity such as "16" or "7500m"',
    "memory": 'a memory quantity such as "64Gi"',
    "queues": "a list of queue names",
    "priority_classes": "an object of class name to integer priority",
    "strategy": '"BestEffortFIFO" or "StrictFIFO"',
    "preemption": '"Never", "LowerPriority" or "LowerOrNewerEqualPriority"',
    "privacy": '"names" or "counts"',
    "users": 'an object of user name (or "group:NAME", or "*") to rules',
}
_RULE = {
    "max_gpus": "an integer of 0 or more",
    "priority_classes": "a list of priority class names",
    "default_priority_class": "a priority class name",
}


@dataclass(frozen=True)
class Identity:
    """Who is at the other end of a connection: SO_PEERCRED's uid and gid, with the user's name
    and the names of every group it is in (as `id` shows them)."""

    uid: int
    gid: int
    user: str
    groups: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Rule:
    """What one user may do; None is no limit (`max_gpus`), every class (`priority_classes`) or
    no class, priority 0 (`default_priority_class`)."""

    max_gpus: int | None = None
    priority_classes: tuple[str, ...] | None = None
    default_priority_class: str | None = None


@dataclass(frozen=True)
class SystemConfig:
    """The system service's settings, as loaded from `path`."""

    quota: protocol.Quota
    privacy: str = "names"
    users: Mapping[str, Rule] = field(default_factory=dict)
    """The `users` entries in the file's order: a user name, "group:NAME" or "*"."""
    path: Path = DEFAULT_PATH

    def rule_for(self, who: Identity) -> Rule:
        """The rule for `who`: each setting from the first entry that sets it, looking at the
        user's own entry, then the entries of its groups in the file's order, then "*"."""
        entries = [self.users[who.user]] if who.user in self.users else []
        entries += [
            rule
            for key, rule in self.users.items()
            if key.startswith(GROUP_PREFIX) and key[len(GROUP_PREFIX) :] in who.groups
        ]
        if EVERYONE in self.users:
            entries.append(self.users[EVERYONE])
        settings: dict[str, Any] = {}
        for rule in entries:
            for name in _RULE:
                if name not in settings and getattr(rule, name) is not None:
                    settings[name] = getattr(rule, name)
        return Rule(**settings)


def load(path: Path = DEFAULT_PATH) -> SystemConfig:
    """Read and check the config at `path` (blocking: called before the loop runs)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{path} does not exist; write one (etc/kernel-queue/machine.json in kernel-queue's "
            "sources is an example) or pass --config"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}; fix the file") from None
    return parse(data, path)


def parse(data: Any, path: Path = DEFAULT_PATH) -> SystemConfig:
    """Check `data` (the file's JSON) and return its `SystemConfig`; ConfigError naming the
    first wrong key and its fix."""
    where = str(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a JSON object of settings ({', '.join(_TOP)})")
    _known(data, _TOP, where)
    classes = _priority_classes(data.get("priority_classes", {}), where)
    quota = protocol.Quota(
        gpus=_gpus(data.get("gpus", []), where),
        cpu=_quantity(data, "cpu", 1000 * (os.cpu_count() or 1), quantities.millicores, where),
        memory=_quantity(data, "memory", _all_memory(), quantities.bytes_, where),
        queues=_names(data.get("queues", ["default"]), "queues", where),
        priority_classes=classes,
        strategy=_choice(data, "strategy", admission.QueueingStrategy, where),
        preemption=_choice(data, "preemption", admission.PreemptionPolicy, where),
        pretend=_bool(data.get("pretend", False), "pretend", where),
    )
    privacy = data.get("privacy", "names")
    if privacy not in PRIVACY:
        raise ConfigError(f"{where}: privacy is {privacy!r}; it must be {_TOP['privacy']}")
    users = data.get("users", {})
    if not isinstance(users, dict):
        raise ConfigError(f"{where}: users must be {_TOP['users']}, not {users!r}")
    rules = {str(key): _rule(key, value, classes, where) for key, value in users.items()}
    return SystemConfig(quota, privacy, rules, path)


def _all_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _known(data: Mapping[str, Any], keys: Mapping[str, str], where: str) -> None:
    for key in data:
        if key not in keys:
            raise ConfigError(
                f"{where}: unknown key {key!r}; the keys are {', '.join(keys)} (remove it or fix "
                "its spelling)"
            )


def _gpus(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return tuple(str(i) for i in range(value))
    if isinstance(value, list) and all(isinstance(v, str | int) for v in value):
        ids = tuple(str(v) for v in value)
        if len(set(ids)) == len(ids):
            return ids
    raise ConfigError(f"{where}: gpus is {value!r}; it must be {_TOP['gpus']}, each id once")


def _quantity(data: Mapping[str, Any], key: str, default: int, unit: Any, where: str) -> int:
    if key not in data:
        return default
    try:
        return int(unit(data[key]))
    except quantities.QuantityError:
        raise ConfigError(f"{where}: {key} is {data[key]!r}; it must be {_TOP[key]}") from None


def _names(value: Any, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise ConfigError(f"{where}: {key} is {value!r}; it must be {_TOP[key]} (at least one)")


def _priority_classes(value: Any, where: str) -> dict[str, int]:
    if isinstance(value, dict) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value.values()
    ):
        return {str(k): v for k, v in value.items()}
    raise ConfigError(
        f"{where}: priority_classes is {value!r}; it must be {_TOP['priority_classes']}"
    )


_CHOICE_DEFAULTS = {"strategy": "BestEffortFIFO", "preemption": "LowerPriority"}


def _choice(data: Mapping[str, Any], key: str, kind: Any, where: str) -> str:
    value = data.get(key, _CHOICE_DEFAULTS[key])
    try:
        return str(kind(value))
    except ValueError:
        raise ConfigError(f"{where}: {key} is {value!r}; it must be {_TOP[key]}") from None


def _bool(value: Any, key: str, where: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{where}: {key} is {value!r}; it must be {_TOP[key]}")


def _rule(key: Any, value: Any, classes: Mapping[str, int], where: str) -> Rule:
    at = f"{where}: users[{key!r}]"
    _exists(str(key), at)
    if not isinstance(value, dict):
        raise ConfigError(f"{at} must be an object of rules ({', '.join(_RULE)}), not {value!r}")
    _known(value, _RULE, at)
    limit = value.get("max_gpus")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"{at}.max_gpus is {limit!r}; it must be {_RULE['max_gpus']}")
    allowed = value.get("priority_classes")
    if allowed is not None:
        if not isinstance(allowed, list) or not all(isinstance(c, str) for c in allowed):
            raise ConfigError(
                f"{at}.priority_classes is {allowed!r}; it must be {_RULE['priority_classes']}"
            )
        for name in allowed:
            _known_class(name, classes, f"{at}.priority_classes")
    default = value.get("default_priority_class")
    if default is not None:
        if not isinstance(default, str):
            raise ConfigError(f"{at}.default_priority_class is {default!r}; it must be a name")
        _known_class(default, classes, f"{at}.default_priority_class")
        if allowed is not None and default not in allowed:
            raise ConfigError(
                f"{at}.default_priority_class {default!r} is not in its priority_classes "
                f"({', '.join(allowed)}); add it there or pick one of those"
            )
    return Rule(limit, None if allowed is None else tuple(allowed), default)


def _known_class(name: str, classes: Mapping[str, int], at: str) -> None:
    if name not in classes:
        known = ", ".join(sorted(classes)) or "none"
        raise ConfigError(
            f"{at} names priority class {name!r}, which priority_classes does not define "
            f"(defined: {known}); define it or fix the name"
        )


def _exists(key: str, at: str) -> None:
    if key == EVERYONE:
        return
    if key.startswith(GROUP_PREFIX):
        try:
            grp.getgrnam(key[len(GROUP_PREFIX) :])
        except KeyError:
            raise ConfigError(
                f"{at}: there is no group {key[len(GROUP_PREFIX) :]!r} on this machine "
                "(`getent group` lists them); fix the name or remove the entry"
            ) from None
        return
    try:
        pwd.getpwnam(key)
    except KeyError:
        raise ConfigError(
            f"{at}: there is no user {key!r} on this machine (`getent passwd` lists them; a "
            'group is written "group:NAME"); fix the name or remove the entry'
        ) from None


def identify(uid: int, gid: int) -> Identity:
    """The user and groups of a peer's uid and gid (blocking: NSS may ask a directory server,
    so the service calls it in a worker thread). A uid without a passwd entry is named by its
    number and is in its gid's group only."""
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        return Identity(uid, gid, str(uid), frozenset(_group_names([gid])))
    try:
        gids = os.getgrouplist(user, gid)
    except OSError:
        gids = [gid]
    return Identity(uid, gid, user, frozenset(_group_names(gids)))


def _group_names(gids: list[int]) -> list[str]:
    names = []
    for gid in gids:
        try:
            names.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            names.append(str(gid))
    return names
