"""Configuration: gin files and bindings, absl flags, and where files are.

* `gin_utils`: the entry points' gin plumbing (flags, search paths,
  parsing) and which macros files and bindings define and read (typos).
* `gin_reader`: gin files read without a live configuration (statements,
  macros, a model's `T5Config`).
* `flag_utils`: absl flags parsed into a FlagValues of their own.
* `paths`: the repository's folders and how a relative path is resolved.
"""
