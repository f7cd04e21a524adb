"""Reading answers out of responses: integers, marker lines ("#### 42"), and free-form math answers.

Everything here is pure string work on untrusted model output: no eval, bounded lengths, and a number too
long to be an answer is treated as unreadable, never as an error.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

MARKER = "####"
MAX_NUMBER_CHARS = 1000  # a longer digit string is not an answer; also stays below int()'s 4300-digit limit

_INT = re.compile(r"-?[0-9]+")
# A number in prose: optional sign (a '-' right after a digit, letter or ')' is subtraction, not a sign),
# digits with optional thousands commas, optional decimals, optional '/denominator' (fractions like 3/4).
_NUMBER = re.compile(
    r"(?:(?<![\w)])[-+])?(?:(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)(?:/[0-9]+(?:\.[0-9]+)?)?")


def cut_at_stop(response: str, stop_strings: tuple[str, ...]) -> str:
    """The text before the earliest stop string (all of it when there is none)."""
    end = len(response)
    for stop in stop_strings:
        at = response.find(stop)
        if at != -1:
            end = min(end, at)
    return response[:end]


def parse_int(text: str) -> int | None:
    """`text`, stripped of surrounding whitespace, as an integer: `-?[0-9]+` exactly, else None."""
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS or not _INT.fullmatch(text):
        return None
    return int(text)


def marker_line(text: str, marker: str = MARKER) -> str | None:
    """What follows `marker` on the first line that starts with it (after indentation), stripped; None if no
    line does. Lines after it are ignored (a response that runs on past its answer keeps that answer)."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(marker):
            return stripped[len(marker):].strip()
    return None


def parse_number(text: str) -> Fraction | None:
    """A number as written in prose ('1,234', '-0.5', '3/4', '+7') as an exact Fraction; None if it is not
    one, or if it is a fraction with a zero denominator."""
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS or not _NUMBER.fullmatch(text):
        return None
    num, _, den = text.replace(",", "").partition("/")
    try:
        value = Fraction(num)
        return value / Fraction(den) if den else value
    except (ValueError, ZeroDivisionError):
        return None


def extract_final_number(text: str, marker: str = MARKER) -> str | None:
    """The final answer of a free-form response, as written: the first number after the first `marker`
    when the text has one (like show-work answers: what follows is ignored), else the last number anywhere
    in the text; None if there is none."""
    at = text.find(marker)
    if at != -1:
        match = _NUMBER.search(text, at + len(marker))
        return match.group() if match else None
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def normalize_number(text: str) -> str:
    """'1,234' -> '1234', '+7' -> '7', '3/4' -> '3/4': the written form without commas or a plus sign."""
    return text.strip().replace(",", "").removeprefix("+")


def numbers_match(got: Fraction, want: Fraction, tolerance: float) -> bool:
    """Equal exactly, or within `tolerance` relative to the reference (absolute near zero)."""
    if got == want:
        return True
    try:
        return math.isclose(float(got), float(want), rel_tol=tolerance, abs_tol=tolerance)
    except OverflowError:  # beyond float range and not exactly equal
        return False
