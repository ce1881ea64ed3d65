"""predictions.jsonl's per-example records of a speculative decode: the
accepted count of every target call and a Figure-1-style trace of its
guesses, as text (`token_text`: one token as SentencePiece writes it).

Nothing measured goes there, so two runs with the same settings and seed
write the same records.
"""
import functools
from typing import List, Sequence

import numpy as np

from specdec_jax.core import decoding
from specdec_jax.data import vocab as vocab_lib


def traces(vocab, out: decoding.SpeculativeOutput,
           keep: Sequence[int]) -> List[dict]:
  """Accepted counts and a Figure-1-style trace of each target call, for the
  rows `keep` of a batch's output (`out` on the host)."""
  rows = []
  calls = np.asarray(out.target_calls)
  drafts = np.asarray(out.trace_draft_tokens)
  accepted = np.asarray(out.trace_num_accepted)
  nexts = np.asarray(out.trace_next_token)
  piece = functools.partial(token_text, vocab)
  for r in keep:
    n = int(calls[r])
    rows.append({
        "accepted_counts": accepted[r, :n].tolist(),
        "trace": [
            {
                "draft_tokens": [
                    piece(t) for t in drafts[r, i] if t != decoding.NO_GUESS
                ],
                "num_accepted": int(accepted[r, i]),
                # None: the output ended inside the accepted guesses.
                "target_token":
                    (None if nexts[r,
                                   i] == decoding.NO_TOKEN else piece(nexts[r,
                                                                            i]))
            } for i in range(n)
        ],
    })
  return rows


def tree_traces(out: decoding.TreeOutput, keep: Sequence[int]) -> List[dict]:
  """The accepted count of each tree call, for the rows `keep` of a batch's
  output (`out` on the host); "trace" is null: a tree call's k branches
  have no one Figure-1 line (the kept path's guesses are in the output)."""
  calls = np.asarray(out.target_calls)
  accepted = np.asarray(out.trace_num_accepted)
  return [{
      "accepted_counts": accepted[r, :int(calls[r])].tolist(),
      "trace": None
  } for r in keep]


_SPECIAL_PIECES = {
    vocab_lib.PAD_ID: "<pad>",
    vocab_lib.EOS_ID: "</s>",
    vocab_lib.UNK_ID: "<unk>"
}


def token_text(vocab, token) -> str:
  """One token as text, keeping SentencePiece's word-initial space
  (`vocab.decode([t])` drops it, which glues a rendered trace together).

  A token that decodes to nothing on its own (T5's special ids, a byte of a
  multi-byte character in the byte vocabulary) is written as SentencePiece
  writes such pieces (`</s>`, `<0xC3>`), never as an empty string.
  """
  token = int(token)
  tokenizer = getattr(vocab, "tokenizer", None)
  if tokenizer is not None and 0 <= token < tokenizer.get_piece_size():
    return tokenizer.id_to_piece(token).replace("\u2581", " ")
  if token in _SPECIAL_PIECES:
    return _SPECIAL_PIECES[token]
  if tokenizer is None and type(vocab).__name__ == "ByteVocabulary":
    byte = token - len(_SPECIAL_PIECES)  # seqio: 3 special ids, then bytes
    if 0 <= byte < 256:
      return chr(byte) if 0x20 <= byte < 0x7f else f"<0x{byte:02X}>"
  text = vocab.decode([token]) if token >= 0 else ""
  return text if text else f"<id {token}>"
