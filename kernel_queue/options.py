"""`KernelOptions`: the kernelspec config keys of a queued kernel, as traits, and their check.

Shared by the provisioner (jupyter_client ≥ 8) and the Enterprise Gateway 3.x process proxy
(jupyter_client 6), so it imports neither: only traitlets. Traits refuse wrong types (a boolean
is not a number); `check_keys` refuses unknown keys; `spec.build` checks the values. Also the
server-only `PodTemplatePolicy`. Nothing here reads config or the environment at import.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from traitlets import Dict, Float, Int, List, TraitError, TraitType, Unicode, default
from traitlets.config import LoggingConfigurable

from kernel_queue import errors

_KINDS = {bool: "a boolean", str: "a string", float: "a decimal number", list: "a list"}


def shown(value: Any) -> str:
    """A value as an error message shows it: strings quoted (``'a/b'``, lone surrogates
    escaped), other JSON values as kernel.json spells them (``true``, ``Infinity``, ``NaN``)."""
    if isinstance(value, str):
        return repr(value)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return _KINDS.get(type(value), "an object" if isinstance(value, dict) else type(value).__name__)


class _Count(Int[int, int]):
    """A whole number (never a boolean) whose type error says how to write it in kernel.json."""

    def validate(self, obj: Any, value: Any) -> Any:
        if isinstance(value, bool):
            self.error(obj, value)
        return super().validate(obj, value)

    def error(
        self, obj: Any, value: Any, error: Exception | None = None, info: str | None = None
    ) -> Any:
        quotes = " without quotes" if isinstance(value, str) else ""
        raise TraitError(
            f"kernelspec config key '{self.name}' must be a whole number such as 1, "
            f'not {shown(value)} ({_kind(value)}); write "{self.name}": 1{quotes} in kernel.json'
        )


class _Seconds(Float[float, float]):
    """Seconds: a number, never a boolean (finiteness is `spec.build`'s check, naming the
    kernelspec)."""

    def validate(self, obj: Any, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TraitError(
                f"kernelspec config key '{self.name}' must be a number of seconds such as 60, "
                f"not {shown(value)} ({_kind(value)})"
            )
        try:
            seconds = float(value)
        except OverflowError:  # an integer of hundreds of digits (JSON allows it) is no float
            raise TraitError(
                f"kernelspec config key '{self.name}' must be a number of seconds such as 60, "
                f"not a number too large for seconds ({len(str(value))} digits)"
            ) from None
        return super().validate(obj, seconds)


class _Quantity(TraitType[Any, Any]):
    """A Kubernetes quantity: a string ('500m', '8Gi') or a number, never a boolean; its
    grammar and range are `spec.build`'s check (`quantities.parse`)."""

    info_text = "a quantity such as 2, '500m' or '8Gi'"

    def validate(self, obj: Any, value: Any) -> Any:
        if value is None or (isinstance(value, str | int | float) and not isinstance(value, bool)):
            return value
        raise TraitError(
            f"kernelspec config key '{self.name}' must be a quantity such as 2, '500m' or "
            f"'8Gi', not {shown(value)} ({_kind(value)})"
        )


class _Argv(TraitType[list[str], list[str]]):
    """A command as an argv list of strings (no shell: each word its own string)."""

    info_text = "a list of strings"

    def __init__(self, help: str) -> None:
        super().__init__(default_value=[], config=True, help=help)

    def validate(self, obj: Any, value: Any) -> Any:
        if isinstance(value, list | tuple) and all(isinstance(word, str) for word in value):
            return list(value)
        raise TraitError(
            f"kernelspec config key '{self.name}' must be a list of strings, one per word, such "
            f'as ["dask", "worker", "tcp://$(MASTER_ADDR):8786"], not {shown(value)} '
            f"({_kind(value)})"
        )


def _quantity(help: str) -> _Quantity:
    return _Quantity(default_value=None, allow_none=True, config=True, help=help)


def unknown_keys(given: Iterable[str], known: Sequence[str], noun: str = "key") -> str | None:
    """ "unknown key `gpu` (did you mean `gpus`?)" for the keys of `given` not in `known`
    (sorted, each with its nearest known key if one is close); None when all are known."""
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return None
    guesses = {key: guess for key in unknown if (guess := nearest(key, known))}
    listed = ", ".join(f"`{key}`" for key in unknown)
    text = f"unknown {noun}{'s' if len(unknown) > 1 else ''} {listed}"
    if len(unknown) == 1 and guesses:
        return f"{text} (did you mean `{guesses[unknown[0]]}`?)"
    if guesses:
        hints = ", ".join(f"`{guess}` for `{key}`" for key, guess in guesses.items())
        return f"{text} (did you mean {hints}?)"
    return text


def nearest(key: str, known: Sequence[str]) -> str | None:
    """The known key `key` was probably meant as (difflib, or the one it begins), else None."""
    found = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if found:
        return found[0]
    starts = [k for k in known if len(key) >= 3 and (k.startswith(key) or key.startswith(k))]
    return starts[0] if len(starts) == 1 else None


def check_keys(values: Mapping[str, Any], *, where: str, stanza: str) -> None:
    """Raise `ConfigError` naming each key of `values` that is not a kernelspec config key.

    The one check for every path: the provisioner (`spec.build`, jupyter_server and Kernel
    Gateway) and Enterprise Gateway's proxy (`gateway.launch.kernel_options`)."""
    known = sorted(KernelOptions.keys())
    problem = unknown_keys(values, known, noun="config key")
    if problem is None:
        return
    text = f"{where}: {problem}; the keys are {', '.join(known)} (in {stanza})"
    if any(_server_setting(key) for key in set(values) - set(known)):
        text += (
            ". Pod policy exceptions are a server setting, "
            "c.PodTemplatePolicy.allowed_exceptions in the server's config: a kernelspec cannot "
            "grant them to itself"
        )
    raise errors.ConfigError(text)


def _server_setting(key: str) -> bool:
    lowered = key.lower()
    return "exception" in lowered or "policy" in lowered


class KernelOptions(LoggingConfigurable):
    """Every trait is a kernelspec config key (kernel.json wins over config files)."""

    backend = Unicode(
        config=True,
        help="""Where kernels run: 'local' (this machine) or 'kubernetes'.
        Env: KERNEL_QUEUE_BACKEND.""",
    )
    queue = Unicode("default", config=True, help="The queue (Kueue LocalQueue) to wait in.")
    namespace = Unicode(None, allow_none=True, config=True, help="Kubernetes namespace.")
    image = Unicode(None, allow_none=True, config=True, help="Container image of kernel pods.")
    gpus = _Count(0, config=True, help="GPUs the kernel asks for.")
    gpu_resource = Unicode("nvidia.com/gpu", config=True, help="Extended resource name of a GPU.")
    cpu = _quantity("CPU the kernel asks for, a quantity such as 2 or '500m'.")
    memory = _quantity("Memory the kernel asks for, a quantity such as '8Gi'.")
    priority_class = Unicode(
        None, allow_none=True, config=True, help="Priority class (Kueue WorkloadPriorityClass)."
    )
    pod_group_size = _Count(1, config=True, help="Pods in the kernel's group (kubernetes).")
    worker_command = _Argv(
        help="""The command each worker pod of a group runs (an argv list; pod_group_size > 1),
        supervised by the launcher's worker mode. Kubernetes expands $(VAR) in it, such as
        $(MASTER_ADDR).""",
    )
    pod_template = Dict(config=True, help="Pod fields merged under the ones kernel-queue sets.")
    service_account = Unicode(None, allow_none=True, config=True, help="Pods' service account.")
    connect = Unicode(
        "service",
        config=True,
        help="""kubernetes: connect through the kernel's Service ('service', a stable address
        across pod replacement; the server must reach cluster IPs) or its pod's IP ('pod-ip').""",
    )
    admission_timeout = _Seconds(
        0.0, config=True, help="Seconds to wait in the queue before giving up; 0 waits forever."
    )
    startup_timeout = _Seconds(
        120.0, config=True, help="Seconds from admission until the kernel must be running."
    )
    checkpoint = Dict(
        config=True,
        help="Checkpoint settings: enabled, path or claim, grace_seconds, keep, continuous.",
    )
    park_after = _Seconds(
        0.0,
        config=True,
        help="""Seconds a kernel may sit idle (no cell running, no output, no client message)
        before it is parked: it saves, gives back its GPUs and comes back on its next cell.
        0 never parks. Needs checkpoints, and Jupyter Server with the kernel_queue extension.""",
    )

    @default("backend")
    def _backend_from_env(self) -> str:
        return os.environ.get("KERNEL_QUEUE_BACKEND", "local")

    @classmethod
    def keys(cls) -> frozenset[str]:
        """The kernelspec config keys (trait names of this class, not of its subclasses)."""
        return frozenset(KernelOptions.class_own_traits(config=True))


class PodTemplatePolicy(LoggingConfigurable):
    """What a kernelspec's `pod_template` may set despite the pod policy
    (`kube.objects.pod_policy`).

    A server setting (`c.PodTemplatePolicy.allowed_exceptions` in the server's config), never a
    kernelspec key: a kernelspec must not be able to grant itself host access."""

    allowed_exceptions = List(
        Unicode(),
        config=True,
        help="""Pod policy rules (such as 'hostPath' or 'privileged') or field paths (such as
        'spec.volumes[*].hostPath' or 'spec.containers[1].securityContext.privileged', where
        [*] is any index) that pod templates may set anyway. Every other rule still holds.""",
    )
