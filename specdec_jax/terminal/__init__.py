"""What the commands print: the first screen and progress lines.

* `console`: the run's own lines, not the libraries' probing noise (libtpu's
  block on a CPU run kept aside; COMPILE_TOPOLOGY saves it), and
  one plain line for every phase longer than a moment.
"""
