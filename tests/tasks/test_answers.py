"""Answer readers: integers, marker lines, free-form math answers (hand-checked cases)."""

from fractions import Fraction

import pytest

from trace_rl.tasks.answers import (
    cut_at_stop,
    extract_final_number,
    marker_line,
    numbers_match,
    parse_int,
    parse_number,
)


@pytest.mark.parametrize("text,want", [
    ("42", 42), (" 42 ", 42), ("\t-7", -7), ("007", 7), ("0", 0),
    ("", None), ("4 2", None), ("+5", None), ("42.0", None), ("1,000", None), ("-", None), ("12a", None),
    ("٣", None),  # non-ASCII digits are not an answer in these formats
    ("9" * 2000, None),  # too long to be an answer: unreadable, not an exception
])
def test_parse_int(text, want):
    assert parse_int(text) == want


def test_cut_at_stop_takes_the_earliest():
    assert cut_at_stop("12\n34", ("\n",)) == "12"
    assert cut_at_stop("a;b\nc", ("\n", ";")) == "a"
    assert cut_at_stop("abc", ()) == "abc"


def test_marker_line_is_the_first_marked_line():
    assert marker_line("work\n  #### 12 \n#### 13") == "12"
    assert marker_line("no marker here") is None
    assert marker_line("x #### 5") is None  # the marker must start its line


@pytest.mark.parametrize("text,want", [
    ("The answer is 42.", "42"),
    ("3 apples and 4 pears, 7 in all", "7"),
    ("so #### 1,234 dollars\nand 99 later", "1,234"),   # after the marker beats the last number
    ("#### 5\n#### 6", "5"),                          # the first answer counts, as in show-work answers
    ("#### $-3.50", "-3.50"),
    ("x = -5", "-5"),
    ("10-5", "5"),                                      # a '-' after a digit is subtraction, not a sign
    ("(-2)", "-2"),
    ("it is 3/4 of it", "3/4"),
    ("no digits", None),
    ("#### none", None),
])
def test_extract_final_number(text, want):
    assert extract_final_number(text) == want


@pytest.mark.parametrize("text,want", [
    ("1,234", Fraction(1234)), ("-0.5", Fraction(-1, 2)), ("3/4", Fraction(3, 4)), ("+7", Fraction(7)),
    (".25", Fraction(1, 4)), ("1.5/3", Fraction(1, 2)), ("3/0", None), ("1,23", None), ("abc", None),
])
def test_parse_number(text, want):
    assert parse_number(text) == want


def test_numbers_match_tolerance():
    assert numbers_match(Fraction(3, 4), parse_number("0.75"), 0.0)
    assert numbers_match(parse_number("0.3333333"), Fraction(1, 3), 1e-6)
    assert not numbers_match(parse_number("0.333"), Fraction(1, 3), 1e-6)
    assert not numbers_match(Fraction(10) ** 400, Fraction(10) ** 400 + 1, 1e-6)  # beyond float range: exact only
