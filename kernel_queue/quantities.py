"""Parse Kubernetes resource quantities ("500m", "2", "4Gi", "1e3") into integers.

The grammar is Kubernetes' `resource.Quantity`; CPU becomes millicores and memory bytes, the
integer units `admission.py` counts in. Pure functions; used by the provisioner's validation,
`jupyter kernel-queue install` and both backends.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
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
# resource.Quantity's grammar: <sign><number><suffix>, where <number> is `1`, `1.5`, `1.` or
# `.5` and <suffix> a binary or decimal SI suffix or an exponent `e<signed integer>` ("1E" is
# exa, "1E3" a thousand). No spaces anywhere.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<suffix>[KMGTPE]i|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
LARGEST = Decimal(2**63 - 1)
"""Kubernetes holds no quantity above 2^63-1 (it caps them); we refuse them instead."""


class QuantityError(ValueError):
    """`value` is not a quantity we accept; `reason` says why ("is negative")."""

    def __init__(self, value: object, reason: str) -> None:
        super().__init__(f"{value!r} {reason}")
        self.value, self.reason = value, reason


_NOT_A_QUANTITY = "is not a quantity such as '2', '500m', '4Gi' or '16G'"


def parse(value: str | int | float) -> Decimal:
    """Return the quantity as a Decimal in base units; raise `QuantityError` naming the bad
    text. Negative, non-finite and too-large values are refused too: none is a request."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(value, _NOT_A_QUANTITY)
    if isinstance(value, float) and not math.isfinite(value):
        raise QuantityError(value, "is not a finite number")
    if isinstance(value, int | float):
        amount = Decimal(str(value))
    else:
        match = _QUANTITY.fullmatch(value)
        if match is None:
            raise QuantityError(value, _NOT_A_QUANTITY)
        amount = _amount(match)
    if amount < 0:
        raise QuantityError(value, "is negative")
    if amount > LARGEST:
        raise QuantityError(value, "is larger than Kubernetes allows (2^63-1)")
    return amount


def _amount(match: re.Match[str]) -> Decimal:
    number = Decimal(match["number"])
    if match["sign"] == "-":
        number = -number
    if match["exponent"] is None:
        return number * _SUFFIXES[match["suffix"] or ""]
    exponent = int(match["exponent"])
    if exponent > 40:  # beyond 2^63-1 for any number that is not 0; keeps Decimal small
        return number * Decimal("1e41")
    return number.scaleb(max(exponent, -40))


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
