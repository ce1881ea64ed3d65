"""Configuration: gin files and bindings, absl flags, and where files are.

* `gin_utils`: the entry points' gin plumbing (flags, search paths, parsing).
* `gin_reader`: gin files read without a live configuration (statements,
  macros, a model's `T5Config`).
* `gin_macros`: which macros files and bindings define and read (typos).
* `flag_utils`: absl flags parsed into a FlagValues of their own.
* `paths`: the repository's folders and how a relative path is resolved.
"""
