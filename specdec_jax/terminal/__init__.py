"""What the commands print: the first screen and progress lines.

* `console`: the run's own lines, not the libraries' probing noise, and
  one plain line for every phase longer than a moment.
"""
