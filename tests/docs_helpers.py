"""Reading README.md's sections and code blocks, shared by
tests/project/test_docs.py and tests/e2e/test_docs_e2e.py."""
import re

from conftest import REPO


def section(text: str, heading: str) -> str:
  """The text under a Markdown heading, up to the next heading of its level
  or above."""
  level = len(heading) - len(heading.lstrip("#"))
  body = text.split(heading + "\n", 1)[1]
  stop = re.search(rf"^#{{1,{level}}} ", body, re.M)
  return body[:stop.start()] if stop else body


def fenced(text: str, lang: str = "") -> list:
  """The fenced code blocks of `text` (```lang ... ```)."""
  return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)


def readme() -> str:
  return (REPO / "README.md").read_text(encoding="utf-8")
