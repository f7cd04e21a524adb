"""A small parser and exact evaluator for countdown expressions; model output is never passed to eval().

Grammar (spaces allowed between tokens):

    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := NUMBER | '(' expr ')'
    NUMBER := [0-9]+

Usual precedence, left-associative. No unary minus, no other characters. Evaluation is exact (Fraction):
`/` is true division, intermediate results may be fractions, division by zero raises ZeroDivisionError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MAX_CHARS = 500  # longer responses are not expressions over a handful of numbers
MAX_DEPTH = 50   # nesting bound: keeps recursion far from Python's limit on hostile input
_TOKEN = re.compile(r"\s*(?:([0-9]+)|([-+*/()]))")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


class ExpressionError(ValueError):
    """The text is not an expression in the grammar above; the message says where."""


@dataclass(frozen=True)
class Num:
    text: str

    @property
    def value(self) -> int:
        return int(self.text)


@dataclass(frozen=True)
class BinOp:
    op: str
    left: Node
    right: Node


Node = Num | BinOp


def tokenize(text: str) -> list[str]:
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"expression longer than {MAX_CHARS} characters")
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ExpressionError(f"unexpected character {text[pos:].lstrip()[:1]!r} at {pos}")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    if not tokens:
        raise ExpressionError("empty expression")
    return tokens


def parse(text: str) -> Node:
    """The syntax tree of `text`; ExpressionError if it is not in the grammar."""
    tokens = tokenize(text)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def binary(level: int, depth: int) -> Node:
        operand = (lambda: binary(2, depth)) if level == 1 else (lambda: factor(depth))
        node = operand()
        while peek() is not None and _PRECEDENCE.get(peek()) == level:
            op = take()
            node = BinOp(op, node, operand())
        return node

    def factor(depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise ExpressionError(f"parentheses nested deeper than {MAX_DEPTH}")
        tok = peek()
        if tok is None:
            raise ExpressionError("expression ends where a number or '(' was expected")
        take()
        if tok.isdigit():
            return Num(tok)
        if tok == "(":
            node = binary(1, depth + 1)
            if peek() != ")":
                raise ExpressionError("unclosed '('")
            take()
            return node
        raise ExpressionError(f"{tok!r} where a number or '(' was expected")

    node = binary(1, 0)
    if pos != len(tokens):
        raise ExpressionError(f"unexpected {tokens[pos]!r} after a complete expression")
    return node


def numbers_used(node: Node) -> list[str]:
    """The number literals of the expression, left to right, as written."""
    if isinstance(node, Num):
        return [node.text]
    return numbers_used(node.left) + numbers_used(node.right)


def evaluate(node: Node) -> Fraction:
    """Exact value; raises ZeroDivisionError on division by zero."""
    if isinstance(node, Num):
        return Fraction(node.value)
    a, b = evaluate(node.left), evaluate(node.right)
    if node.op == "+":
        return a + b
    if node.op == "-":
        return a - b
    if node.op == "*":
        return a * b
    return a / b


def render(node: Node, parent: int = 0, right_of_noncommutative: bool = False) -> str:
    """The expression with only the parentheses precedence requires (`(1+2)*3`, `8-(3-1)`)."""
    if isinstance(node, Num):
        return node.text
    prec = _PRECEDENCE[node.op]
    text = (render(node.left, prec) + node.op
            + render(node.right, prec, right_of_noncommutative=node.op in "-/"))
    needs_parens = prec < parent or (prec == parent and right_of_noncommutative)
    return f"({text})" if needs_parens else text
