"""Reading a memory budget: bytes, a string with units, or a fraction of the peak."""

from __future__ import annotations

import re

from remat.errors import RematError

UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
ACCEPTED = (
    'an int of bytes (6442450944), a string with binary or decimal units ("6GiB", "6GB", "800MiB", "1.5 GB"), '
    'or a fraction of the unplanned peak: a float 0 < f <= 1 (0.5), or a percentage ("50%", "0.5")'
)
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_PERCENT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")
_FRACTION = re.compile(r"^\s*[0-9]*\.[0-9]+\s*$")


def parse_budget(budget: int | float | str, peak_bytes: int) -> int:
    """Bytes for `budget`; the same forms in Python and on the command line.

    Example: parse_budget("800MiB", prof.peak_bytes) == 838860800; parse_budget("50%", 1000) == 500

    "6GB" is 6e9 bytes and "6GiB" is 6*2**30: both accepted, told apart.  A float, a
    percentage, or a string with a decimal point and no unit ("0.5") is a fraction of
    `peak_bytes`; an int, or a string of digits, is bytes.
    """
    if isinstance(budget, bool) or not isinstance(budget, (int, float, str)):
        raise _bad(budget)
    if isinstance(budget, str) and (_PERCENT.match(budget) or _FRACTION.match(budget)):
        percent = _PERCENT.match(budget)
        return _fraction(float(percent.group(1)) / 100 if percent else float(budget), budget, peak_bytes)
    if isinstance(budget, float):
        return _fraction(budget, budget, peak_bytes)
    if isinstance(budget, int):
        if budget <= 0:
            raise _bad(budget, " (a budget is the memory the step may use: more than 0 bytes)")
        return budget
    m = _PATTERN.match(budget)
    if m is None:
        raise _bad(budget)
    value = float(m.group(1)) * UNITS[(m.group(2) or "").lower()]
    if value < 1:
        raise _bad(budget, " (a budget is the memory the step may use: at least 1 byte)")
    return int(value)


def _fraction(f: float, given, peak_bytes: int) -> int:
    if not 0 < f <= 1:
        raise _bad(given, " (a fraction of the unplanned peak must be in (0, 1], a percentage in (0%, 100%])")
    return int(f * peak_bytes)


def _bad(budget, extra: str = "") -> RematError:
    return RematError(
        f"remat: cannot read the budget {budget!r}{extra}; expected {ACCEPTED}. "
        'Fix: write e.g. budget="6GiB" or budget=0.5.'
    )


_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgtp]?)(i?)(b|flop)s?\s*/\s*s\s*$", re.IGNORECASE)


def _unit(example: str) -> str:
    """ "b" or "flop": what remat's own `example` of a rate counts."""
    m = _RATE.match(example)
    if m is None:
        raise ValueError(f"not a rate: {example!r}")  # remat's own examples always are
    return m.group(4).lower()


_PREFIX = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_rate(value: int | float | str, what: str, example: str) -> float:
    """Per-second figure for offload costs: a positive number, or a string like "16GB/s", "16GiB/s", "300TFLOPs/s"
    (bytes for a bandwidth, FLOPs for a compute rate: the unit of `example` is the one accepted).

    Example: parse_rate("16GB/s", "offload_bandwidth", "16GB/s") == 16e9
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    unit = _unit(example)
    if isinstance(value, str):
        m = _RATE.match(value)
        if m is not None and m.group(4).lower() == unit:
            number, prefix, binary, _ = m.groups()
            base = 1024 if binary else 1000
            return float(number) * base ** _PREFIX[prefix.lower()]
    kind = (
        'bytes per second: a positive number, or a string like "16GB/s" or "16GiB/s" (GB is 10**9, GiB 2**30)'
        if unit == "b"
        else 'FLOPs per second: a positive number, or a string like "400TFLOPs/s"'
    )
    raise RematError(f'remat: cannot read {what}={value!r}; expected {kind}. Fix: write e.g. {what}="{example}".')
