"""Generated training text for the demo: a tiny English-like grammar, read one character at a time.

Nothing is downloaded. Each "story" opens with an introduction ("zoe has a red fox.") and later sentences
call back to it ("zoe finds the red fox."), so a model can only predict the callback by looking back past
a short sliding window; the other sentences need local structure only (number agreement "two foxes see",
"the fox sees"). A character model starts at ln(vocab) ~ 3.3 nats and drops below ~1.2 once it has learnt
words and agreement.
"""

from __future__ import annotations

import numpy as np

NAMES = ["tom", "ana", "lea", "max", "ivo", "zoe", "kai", "mia", "sam", "eva"]
ADJECTIVES = ["red", "old", "small", "big", "green", "quiet", "happy", "dark", "tall", "cold"]
NOUNS = [
  ("cat", "cats"),
  ("dog", "dogs"),
  ("bird", "birds"),
  ("box", "boxes"),
  ("tree", "trees"),
  ("fox", "foxes"),
  ("ship", "ships"),
  ("key", "keys"),
  ("lamp", "lamps"),
  ("frog", "frogs"),
]
VERBS = [
  ("sees", "see"),
  ("finds", "find"),
  ("likes", "like"),
  ("opens", "open"),
  ("takes", "take"),
  ("hides", "hide"),
  ("paints", "paint"),
  ("follows", "follow"),
]
PREPOSITIONS = ["near", "under", "behind", "on", "with"]
NUMBERS = ["two", "three", "four", "many"]


def _noun_phrase(rng: np.random.Generator) -> tuple[str, bool]:
  """A noun phrase and whether it is plural."""
  adj = ADJECTIVES[rng.integers(len(ADJECTIVES))]
  sing, plur = NOUNS[rng.integers(len(NOUNS))]
  if rng.random() < 0.4:
    return f"{NUMBERS[rng.integers(len(NUMBERS))]} {adj} {plur}", True
  return f"the {adj} {sing}", False


def _sentence(rng: np.random.Generator) -> str:
  subject, plural = _noun_phrase(rng)
  verb = VERBS[rng.integers(len(VERBS))][1 if plural else 0]
  obj, _ = _noun_phrase(rng)
  tail = f" {PREPOSITIONS[rng.integers(len(PREPOSITIONS))]} {_noun_phrase(rng)[0]}" if rng.random() < 0.3 else ""
  return f"{subject} {verb} {obj}{tail}."


def story(rng: np.random.Generator) -> str:
  """One story: an introduction, 2-5 sentences, and a callback to the introduced name and thing."""
  name = NAMES[rng.integers(len(NAMES))]
  adj = ADJECTIVES[rng.integers(len(ADJECTIVES))]
  noun = NOUNS[rng.integers(len(NOUNS))][0]
  parts = [f"{name} has a {adj} {noun}."]
  parts += [_sentence(rng) for _ in range(rng.integers(2, 6))]
  parts.append(f"{name} {VERBS[rng.integers(len(VERBS))][0]} the {adj} {noun}.")
  return " ".join(parts) + "\n"


def vocabulary() -> str:
  """Every character the grammar can produce, sorted (index = token id)."""
  words = NAMES + ADJECTIVES + [w for pair in NOUNS + VERBS for w in pair] + PREPOSITIONS + NUMBERS
  words += ["has", "a", "the"]
  return "".join(sorted(set("".join(words)) | set(" .\n")))


class CharCorpus:
  """`chars` characters of stories, encoded; `batch` draws random windows of seq_len + 1 tokens."""

  def __init__(self, chars: int = 400_000, seed: int = 0):
    rng = np.random.default_rng(seed)
    self.vocab = vocabulary()
    self._index = {c: i for i, c in enumerate(self.vocab)}
    pieces, n = [], 0
    while n < chars:
      pieces.append(story(rng))
      n += len(pieces[-1])
    self.text = "".join(pieces)[:chars]
    self.tokens = self.encode(self.text)

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def encode(self, text: str) -> np.ndarray:
    return np.array([self._index[c] for c in text], np.int32)

  def decode(self, tokens) -> str:
    return "".join(self.vocab[int(t)] for t in tokens)

  def batch(self, rng: np.random.Generator, batch: int, seq_len: int) -> np.ndarray:
    """[batch, seq_len + 1] int32: inputs are [:, :-1], targets [:, 1:]."""
    starts = rng.integers(0, len(self.tokens) - seq_len - 1, size=batch)
    return np.stack([self.tokens[s : s + seq_len + 1] for s in starts])
