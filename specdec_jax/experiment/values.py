"""What a setting's value is: the type tests every run-argument check uses.

A bool is not a number here (True would pass as 1), and a real must be
finite (inf and nan would run, then be written to JSON as Infinity/NaN).
"""
import math
import numbers
from typing import Any


def is_int(value: Any) -> bool:
  """An integer, not a bool."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
  """An int or a float, not a bool (finite or not)."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
  """A finite int or float, not a bool."""
  return is_number(value) and math.isfinite(value)
