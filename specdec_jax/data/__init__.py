"""Data and tasks: seqio tasks, SentencePiece vocabularies, fixed-shape batches.

* `tasks`: the evaluation tasks (WMT EnDe, CNN/DailyMail, local files).
* `vocab`: T5's SentencePiece vocabularies.
* `batching`: batches of one shape, the last one padded.
"""
