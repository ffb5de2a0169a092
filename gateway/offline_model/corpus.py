"""The text the offline tokenizer is trained on, generated in code so it never changes.

The corpus is a pure function of the constants below (no randomness from the environment, no
files, no network): the same interpreter always produces the same string, which is what makes
the trained tokenizer, and therefore the whole checkpoint, reproducible byte for byte.

It mixes common English words, chat-like sentences built from them with a fixed-seed
`random.Random`, a little code and numbers, and syllable-built pseudo-words. The pseudo-words
are there only to give the BPE trainer enough distinct pairs to reach the target vocabulary:
real words alone run out of merges once every word is a single token.
"""

from __future__ import annotations

import random

# About 450 frequent English words, the kind a chat about an image uses.
_WORDS = """
the be to of and a in that have it for not on with he as you do at this but his by from they
we say her she or an will my one all would there their what so up out if about who get which
go me when make can like time no just him know take people into year your good some could
them see other than then now look only come its over think also back after use two how our
work first well way even new want because any these give day most us is are was were been has
had did said made went found told asked called image picture photo color colour red green blue
yellow black white gray grey orange purple pink brown dark light bright small large big tiny
huge left right top bottom middle center corner edge side front behind above below near far
inside outside cat dog bird horse cow sheep fish tree flower grass sky cloud sun moon star
water river sea lake mountain hill road street car bus train plane boat bicycle house building
window door wall floor table chair bed book cup glass bottle plate food apple banana bread cake
man woman child boy girl person people face hand eye hair head arm leg foot shirt hat shoe
dress city town park garden beach forest field snow rain wind fire smoke shadow reflection
line circle square triangle shape pattern text letter number word sign label chart graph plot
diagram table row column value axis title legend page document screen phone computer keyboard
describe explain show tell answer question help please thank thanks sure certainly here yes
no maybe answer assistant user system model helpful honest short long detailed brief summary
first second third last next previous many few several each every both either neither none
one two three four five six seven eight nine ten hundred thousand million zero half quarter
very really quite rather too more less much little enough almost always never often sometimes
usually while where why because although however therefore instead also again still already
running walking sitting standing holding looking smiling playing reading writing eating flying
swimming driving jumping sleeping talking wearing carrying waiting moving painted printed
written shown seen taken given looks seems appears contains includes shows depicts features
background foreground scene view angle close distance detail texture surface material wood
metal stone paper plastic fabric leather round flat smooth rough soft hard old young happy sad
calm busy empty full open closed clean dirty wet dry hot cold warm cool early late morning
evening night today tomorrow yesterday north south east west between under across through
around against along during before since until upon within without count compare identify
""".split()

# Sentence frames with {n} (noun), {a} (adjective) and {v} (verb) slots, in a chat register.
_FRAMES = (
    "What is in this {n}?",
    "Describe the {n} in detail.",
    "The image shows a {a} {n} next to a {a} {n}.",
    "There are {k} {n}s in the picture.",
    "Can you tell me what the {n} is {v}?",
    "A {a} {n} is {v} near the {n}.",
    "How many {n}s can you see?",
    "I think the {n} on the left is {a}.",
    "Sure! The {n} appears to be {a} and {a}.",
    "Thank you. Now compare it with the {a} {n}.",
    "The {n}'s color is {a}, and it's {v} in the {n}.",
    "Read the text on the {n}, please.",
    "It looks like a {n} with a {a} {n} in the background.",
    "Answer in one word: is the {n} {a}?",
)
_NOUNS = "image picture cat dog car tree house person table chart sign book cup bird road sky"
_ADJS = "red blue green small large bright dark old new round white black happy busy empty"
_VERBS = "running sitting standing holding looking playing reading flying moving waiting"

_CODE = """
def area(width, height):
    return width * height

for i in range(10):
    print(i, i ** 2)

{"role": "user", "content": [{"type": "text", "text": "hello"}]}
x = [1, 2, 3]; y = {"a": 1, "b": 2}  # comment
if (a >= b && c != d) { return -1; }
https://example.com/path/to/image.png?size=512&format=webp
2024-05-17 12:34:56 +0100  3.14159  42%  $19.99  #ff8800  (x, y) -> [0, 1]
"""

_ONSETS = "b c d f g h k l m n p r s t v w z br ch dr gr pl sh st th tr".split()
_VOWELS = "a e i o u ai ea ou y".split()
_CODAS = ["", "", *"n r s t l m nd st ng ck".split()]


def _pseudo_word(rng: random.Random) -> str:
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
        for _ in range(rng.randint(1, 3))
    )


def build_corpus(seed: int = 1234) -> list[str]:
    """The training corpus as a list of short documents; same `seed` -> same list.

    `seed` is fixed by the builder (it does not follow the model seed), so every checkpoint
    of every seed shares one tokenizer.
    """
    rng = random.Random(seed)
    nouns, adjs, verbs = _NOUNS.split(), _ADJS.split(), _VERBS.split()
    docs: list[str] = [" ".join(_WORDS), _CODE]
    # Each word several times, alone and capitalised, so frequent words become single tokens.
    for word in _WORDS:
        docs.append(f"{word} {word.capitalize()} {word}, {word}. {word.upper()}")
    for _ in range(1500):
        frame = rng.choice(_FRAMES)
        docs.append(
            frame.replace("{k}", str(rng.randint(2, 12)))
            .replace("{n}", rng.choice(nouns), 1)
            .replace("{n}", rng.choice(nouns))
            .replace("{a}", rng.choice(adjs), 1)
            .replace("{a}", rng.choice(adjs))
            .replace("{v}", rng.choice(verbs))
        )
    # Chat transcripts as the template lays them out (role name at a line start), so
    # "user", "assistant" and "system" after a newline are single tokens too.
    for q in docs[-300:]:
        docs.append(f"system\nYou are a helpful assistant.\nuser\n{q}\nassistant\nSure.\n")
    for _ in range(400):
        docs.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 16))).capitalize())
    for _ in range(300):
        docs.append(" ".join(_pseudo_word(rng) for _ in range(rng.randint(3, 10))))
    for _ in range(200):
        docs.append(f"{rng.randint(0, 99999)} {rng.random():.4f} {rng.randint(1, 31)}/12/20")
    return docs
