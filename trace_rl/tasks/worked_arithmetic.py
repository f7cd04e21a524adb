"""Worked solutions for arithmetic: digit-by-digit addition with carries, subtraction with borrows, long
multiplication with partial products. Each function returns the lines of work and the result; the work of
`a op b` opens with the line `a op b:` and closes with `a op b=result`.

The work is written for a character-level model: one step per line, digits taken from the right, every
step in the same shape (`7+5+1=13 write 3 carry 1`). Its length grows with the digits: addition and
subtraction take one line per digit, multiplication one line per digit pair (quadratic), which is the
knob behind long answers (2 x 10-digit multiplication is ~6k characters).
"""

from __future__ import annotations


def _digits(x: int) -> list[int]:
    """Decimal digits of x >= 0, least significant first."""
    return [int(c) for c in reversed(str(x))]


def add_lines(a: int, b: int) -> tuple[list[str], int]:
    """a + b for a, b >= 0, column by column."""
    da, db = _digits(a), _digits(b)
    lines, carry, out = [f"{a}+{b}:"], 0, []
    for i in range(max(len(da), len(db))):
        x = da[i] if i < len(da) else 0
        y = db[i] if i < len(db) else 0
        s = x + y + carry
        lines.append(f"{x}+{y}+{carry}={s} write {s % 10} carry {s // 10}")
        out.append(s % 10)
        carry = s // 10
    if carry:
        lines.append(f"write {carry}")
        out.append(carry)
    result = int("".join(map(str, reversed(out))))
    assert result == a + b
    lines.append(f"{a}+{b}={result}")
    return lines, result


def _sub_digits(a: int, b: int) -> list[str]:
    """Column lines of a - b for a >= b >= 0, borrowing from the next column."""
    da, db = _digits(a), _digits(b)
    lines, borrow = [], 0
    for i in range(len(da)):
        x = da[i]
        y = db[i] if i < len(db) else 0
        d = x - y - borrow
        if d < 0:
            lines.append(f"{x}-{y}-{borrow}={d} +10={d + 10} write {d + 10} borrow 1")
            borrow = 1
        else:
            lines.append(f"{x}-{y}-{borrow}={d} write {d} borrow 0")
            borrow = 0
    return lines


def sub_lines(a: int, b: int) -> tuple[list[str], int]:
    """a - b for b >= 0 and any a (a is negative inside a chain like 3-7-2)."""
    result = a - b
    if a < 0:  # a - b = -(|a| + b)
        lines, _ = add_lines(-a, b)
        return [f"{a}-{b}: -({-a}+{b})", *lines[1:-1], f"{a}-{b}={result}"], result
    if a >= b:
        return [f"{a}-{b}:", *_sub_digits(a, b), f"{a}-{b}={result}"], result
    return [f"{a}-{b}: {a}<{b} so -({b}-{a})", *_sub_digits(b, a), f"{a}-{b}={result}"], result


def _times_digit(a: int, d: int) -> tuple[list[str], int]:
    """a * d for one digit d, column by column."""
    lines, carry, out = [f"{a}*{d}:"], 0, []
    for x in _digits(a):
        p = x * d + carry
        lines.append(f"{x}*{d}+{carry}={p} write {p % 10} carry {p // 10}")
        out.append(p % 10)
        carry = p // 10
    if carry:
        lines.append(f"write {carry}")
        out.append(carry)
    result = int("".join(map(str, reversed(out))))
    assert result == a * d
    lines.append(f"{a}*{d}={result}")
    return lines, result


def mul_lines(a: int, b: int) -> tuple[list[str], int]:
    """a * b for a, b >= 0: one partial product per digit of b (shifted by its place), then their sum."""
    lines = [f"{a}*{b}:"]
    partials = []
    for place, d in enumerate(_digits(b)):
        part_lines, part = _times_digit(a, d)
        lines += part_lines
        if place:
            lines.append(f"shift {place}: {part * 10**place}")
        partials.append(part * 10**place)
    total = partials[0]
    for part in partials[1:]:
        sum_lines, total = add_lines(total, part)
        lines += sum_lines
    assert total == a * b
    lines.append(f"{a}*{b}={total}")
    return lines, total


OPS = {"add": ("+", add_lines), "sub": ("-", sub_lines), "mul": ("*", mul_lines)}


def worked_chain(op: str, operands: list[int]) -> tuple[list[str], int]:
    """((x0 op x1) op x2) ..., each binary step worked in full."""
    step = OPS[op][1]
    lines, acc = [], operands[0]
    for x in operands[1:]:
        step_lines, acc = step(acc, x)
        lines += step_lines
    return lines, acc
