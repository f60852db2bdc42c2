"""Parse Kubernetes resource quantities ("500m", "2", "4Gi") into integers.

CPU becomes millicores and memory becomes bytes, the integer units `admission.py` counts in.
Pure functions; used by the provisioner's validation and by both backends.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse(value: str | int | float) -> Decimal:
    """Return the quantity as a Decimal in base units; raise ValueError naming the bad text."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return Decimal(str(value))
    match = _QUANTITY.match(value)
    if match is None or match.group(2) not in _SUFFIXES:
        raise ValueError(f"{value!r} is not a quantity such as '2', '500m', '4Gi' or '16G'")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only digits
        raise ValueError(f"{value!r} is not a number") from exc
    return number * _SUFFIXES[match.group(2)]


def millicores(value: str | int | float) -> int:
    """CPU quantity as whole millicores, rounded up as Kubernetes does."""
    return int((parse(value) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def bytes_(value: str | int | float) -> int:
    """Memory quantity as whole bytes, rounded up."""
    return int(parse(value).to_integral_value(rounding="ROUND_CEILING"))


def format_bytes(amount: int) -> str:
    """Human text for a byte count, in binary units ("4 GiB")."""
    size = float(amount)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}".replace(".0 ", " ")
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
