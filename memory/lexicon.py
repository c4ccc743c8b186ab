"""General English word lists used by the search query analyser.

* ``STOPWORDS``: function words and question words. In an OR query they match nearly
  every message; removing them leaves the words that carry the question.
* ``FORMS``: irregular inflections (``bought`` ↔ ``buy``, ``children`` ↔ ``child``)
  that the Porter stemmer cannot relate. A query word is searched together with every
  form of its family.

These are general-purpose language tables, not tuned to any dataset: there is no
synonym list here ("puppy" does not find "dog"); that gap is covered by searching a
turn together with its neighbours (see ``memory/ranking.py``).
"""

from __future__ import annotations

STOPWORDS: frozenset[str] = frozenset(
    """
    a about above after again against all am an and any are aren as at be because been before being
    below between both but by can cannot could couldn did didn do does doesn doing don down during each
    few for from further had hadn has hasn have haven having he her here hers herself him himself his
    how i if in into is isn it its itself just let me more most my myself no nor not now of off on once
    only or other ought our ours ourselves out over own same shan she should shouldn so some such than
    that the their theirs them themselves then there these they this those through to too under until
    up very was wasn we were weren what when where which while who whom why will with won would wouldn
    you your yours yourself yourselves s t d ll m re ve y o
    ever also really kind sort thing things something anything everything get got gotten getting
    tell told remember remind recall know knew mention mentioned say said ask asked
    near
    """.split()
)

# One family per line: every form relates to every other one.
_IRREGULAR = """
arise arose arisen
awake awoke awoken
be was were been being
bear bore born borne
beat beaten
become became
begin began begun
bend bent
bet
bid
bind bound
bite bit bitten
bleed bled
blow blew blown
break broke broken
breed bred
bring brought
build built
burn burnt
buy bought
catch caught
choose chose chosen
come came
cost
creep crept
cut
deal dealt
dig dug
do did done
draw drew drawn
dream dreamt
drink drank drunk
drive drove driven
eat ate eaten
fall fell fallen
feed fed
feel felt
fight fought
find found
flee fled
fly flew flown
forbid forbade forbidden
forget forgot forgotten
forgive forgave forgiven
freeze froze frozen
get got gotten
give gave given
go went gone
grind ground
grow grew grown
hang hung
have had
hear heard
hide hid hidden
hit
hold held
hurt
keep kept
kneel knelt
know knew known
lay laid
lead led
lean leant
leap leapt
learn learnt
leave left
lend lent
lie lay lain
light lit
lose lost
make made
mean meant
meet met
pay paid
prove proven
put
quit
read
ride rode ridden
ring rang rung
rise rose risen
run ran
say said
see saw seen
seek sought
sell sold
send sent
set
shake shook shaken
shine shone
shoot shot
show shown
shrink shrank shrunk
shut
sing sang sung
sink sank sunk
sit sat
sleep slept
slide slid
speak spoke spoken
speed sped
spend spent
spin spun
split
spread
spring sprang sprung
stand stood
steal stole stolen
stick stuck
sting stung
stink stank stunk
strike struck
strive strove striven
swear swore sworn
sweep swept
swim swam swum
swing swung
take took taken
teach taught
tear tore torn
tell told
think thought
throw threw thrown
understand understood
wake woke woken
wear wore worn
weave wove woven
weep wept
win won
wind wound
write wrote written
child children
person people
man men
woman women
wife wives
life lives
knife knives
wolf wolves
leaf leaves
half halves
foot feet
tooth teeth
mouse mice
goose geese
"""


def _families() -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for line in _IRREGULAR.strip().splitlines():
        words = tuple(line.split())
        for w in words:
            # A word in two families (lay: lie/lay) keeps the union.
            out[w] = tuple(dict.fromkeys(out.get(w, ()) + words))
    return out


FORMS: dict[str, tuple[str, ...]] = _families()


def forms(word: str) -> tuple[str, ...]:
    """``word`` and its irregular relatives (just ``(word,)`` for regular words)."""
    return FORMS.get(word, (word,))
