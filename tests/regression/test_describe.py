"""regression/describe.py: an exception in one line."""

from nnx_pool.regression.describe import error_line


def test_an_exception_is_told_in_one_line_even_without_a_message():
  assert error_line(ValueError("first\nsecond")) == "ValueError: first"
  # A program export refused with no message raised IndexError here once.
  assert error_line(NotImplementedError()) == "NotImplementedError: "
  assert error_line(RuntimeError("x" * 10), 4) == "RuntimeError: xxxx"
