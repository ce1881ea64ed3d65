"""Data and tasks: seqio tasks and SentencePiece vocabularies.

* `tasks`: the evaluation tasks (WMT EnDe, CNN/DailyMail, local files).
* `vocab`: T5's SentencePiece vocabularies.
"""
