"""The built-in corpus ``sentences``: short, simple English sentences from a small grammar.

A word-level toy model trained on it (``attnlab train --data sentences --tokenizer word
--preset toy``) reads "I like to eat apples" as the five tokens a person counts, so its
attention is a 5 x 5 matrix, not 20 x 20 characters. The grammar gives attention something to
do: a verb agrees with its subject across the words between them (``she likes``, ``my
friends like``), an object fits the verb before it (``eat`` -> a food, ``drink`` -> a drink),
a negation picks ``do`` or ``does``, and ``bank`` means a river's bank or a building by what
came before it. Every sentence ends with " ." and a line break (the word tokenizer drops the
line break: sentences are separated by the full stop).

``sentences.txt`` beside this module is ``generate()``'s text, written once and shipped with
the package (a test checks that the two agree): ``python -m attnlab.data.sentences`` writes it
again.
"""

from __future__ import annotations

import random
from pathlib import Path

PATH = Path(__file__).with_name("sentences.txt")
N_SENTENCES = 4000
SEED = 0

# subjects that take the plain verb, and those that take the verb + s
PLURAL = ("I", "you", "we", "they", "my friends", "the children", "the students")
SINGULAR = ("she", "he", "my sister", "my brother", "the teacher", "the old man")
OBJECTS = {
    "eat": ("apples", "pears", "bread", "rice", "soup", "cheese", "cake", "pizza", "dessert",
            "oranges", "eggs", "fish"),
    "drink": ("water", "tea", "coffee", "milk", "juice"),
    "read": ("books", "letters", "the news", "stories"),
    "play": ("football", "chess", "cards", "the piano"),
    "cook": ("rice", "soup", "fish", "eggs", "pasta"),
}  # fmt: skip
LIKES = ("like", "love", "want")
WHEN = ("every day", "in the morning", "at night", "on sunday", "after school", "with friends")
COLOURS = ("blue", "red", "green", "white", "old")
VEHICLES = ("aeroplane", "car", "boat", "train", "bike")
QUALITIES = ("dangerous", "fast", "slow", "loud", "quiet")
RIVER = ("wide", "green", "steep", "quiet", "muddy")
BUILDING = ("open", "closed", "busy", "new")
# sentences said as they are, a few times each, among the generated ones
FIXED = (
    "I like to eat apples .",
    "life is short , eat dessert first .",
    "let's go .",
    "let's go home .",
    "that blue aeroplane is very dangerous .",
    "do not eat the cold pizza .",
)


def _verb(subject: str, verb: str) -> str:
    """``like`` after I/you/we/they, ``likes`` after she/he/a singular noun."""
    return verb if subject in PLURAL else verb + "s"


def sentence(r: random.Random) -> str:
    """One sentence of the grammar (module doc), drawn with ``r``."""
    kind = r.random()
    subject = r.choice(PLURAL + SINGULAR)
    verb = r.choice(tuple(OBJECTS))
    obj = r.choice(OBJECTS[verb])
    if kind < 0.40:  # I like to eat apples
        return f"{subject} {_verb(subject, r.choice(LIKES))} to {verb} {obj} ."
    if kind < 0.60:  # she eats apples every day
        return f"{subject} {_verb(subject, verb)} {obj} {r.choice(WHEN)} ."
    if kind < 0.72:  # he does not like to drink coffee
        do = "do" if subject in PLURAL else "does"
        return f"{subject} {do} not {r.choice(LIKES)} to {verb} {obj} ."
    if kind < 0.80:  # let's eat cake
        return f"let's {verb} {obj} ."
    if kind < 0.88:  # that red car is very fast
        return f"that {r.choice(COLOURS)} {r.choice(VEHICLES)} is very {r.choice(QUALITIES)} ."
    if kind < 0.94:  # the bank of the river is wide / the bank on the corner is open
        if r.random() < 0.5:
            return f"the bank of the river is {r.choice(RIVER)} ."
        return f"the bank on the corner is {r.choice(BUILDING)} ."
    return r.choice(FIXED)


def generate(n: int = N_SENTENCES, seed: int = SEED) -> str:
    """``n`` sentences, one a line, drawn with ``random.Random(seed)``; every FIXED sentence
    appears at least once (the first lines)."""
    r = random.Random(seed)
    lines = list(FIXED) + [sentence(r) for _ in range(n - len(FIXED))]
    return "\n".join(lines) + "\n"


def files() -> list[Path]:
    """The built-in corpus's one file."""
    return [PATH]


if __name__ == "__main__":
    PATH.write_text(generate(), encoding="utf-8")
    print(f"wrote {PATH}")
