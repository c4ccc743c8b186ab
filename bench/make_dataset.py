"""Generate the development recall dataset in ``bench/data/`` (seeded, reproducible).

    python bench/make_dataset.py [--seed 7] [--chats 10] [--out bench/data]

Each output file is one chat in the neutral format read by ``mnemo sessions import``
and ``mnemo bench recall``::

    {"sessions": [{"id", "started_at", "messages": [{"id", "speaker", "content"}]}],
     "questions": [{"id", "question", "evidence": [message ids], "category"}]}

A chat is one synthetic user talking to an assistant over ~10 months: facts about
their life (pets, work, moves, hobbies, family, health, trips, ...) are stated once in
a user turn, the assistant answers in its own words, and the rest of each session is
small talk and *distractors* — messages on the same topics that do not contain the
fact (a friend's dog, a question about dog parks), so that matching a topic word is
not enough. Questions are paraphrased the way people ask later: other inflections
("adopted" → "adopting", "bought" → "buy"), other words ("puppy" → "dog",
"relocated" → "moved"), pronouns, and question words ("what", "which", "did I").
Categories: ``single-hop`` (one evidence turn), ``multi-hop`` (two turns in different
sessions must both be found) and ``temporal`` (the answer depends on when: before/after
a change, or which of several values was true at a date).

The generator knows nothing about the retrievers; the retriever has no synonym list.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

PERSONAS = ["Maya", "Daniel", "Priya", "Tom", "Lena", "Omar", "Sofia", "Kenji", "Ines", "Ravi"]
PETS = [
    ("dog", "puppy", "beagle"),
    ("dog", "puppy", "corgi"),
    ("dog", "pup", "golden retriever"),
    ("dog", "puppy", "husky"),
    ("cat", "kitten", "siamese"),
    ("cat", "kitten", "maine coon"),
    ("dog", "puppy", "dachshund"),
    ("cat", "kitten", "ragdoll"),
]
PET_NAMES = [
    "Biscuit",
    "Pepper",
    "Mochi",
    "Luna",
    "Waffles",
    "Ziggy",
    "Olive",
    "Noodle",
    "Pickles",
    "Juniper",
]
CITIES = [
    "Denver",
    "Lisbon",
    "Toronto",
    "Austin",
    "Seattle",
    "Melbourne",
    "Edinburgh",
    "Kyoto",
    "Portland",
    "Munich",
    "Valencia",
    "Oslo",
]
JOBS = [
    ("data analyst", "Brightwave", "analyzing sales numbers"),
    ("nurse", "St. Anne's hospital", "working night shifts on the cardiology ward"),
    ("high school teacher", "Westbrook High", "teaching chemistry to tenth graders"),
    ("software engineer", "Nimbus Labs", "building the billing backend"),
    ("architect", "Foster & Vale", "designing a public library"),
    ("graphic designer", "Pixelroot", "drawing packaging for a tea brand"),
    ("accountant", "Hartley Partners", "preparing tax returns"),
    ("product manager", "Orbitly", "planning the mobile app roadmap"),
    ("pharmacist", "CityCare pharmacy", "filling prescriptions"),
    ("journalist", "the Daily Ledger", "covering local politics"),
]
HOBBIES = [
    ("pottery", "a pottery class", "throwing bowls on the wheel", "ceramics"),
    ("rock climbing", "a bouldering gym", "climbing the bouldering wall", "climbing"),
    ("sourdough baking", "a bread workshop", "baking sourdough loaves", "bread"),
    ("watercolor painting", "a watercolor course", "painting landscapes", "painting"),
    ("salsa dancing", "salsa lessons", "dancing salsa on Fridays", "dance"),
    ("chess", "a chess club", "playing chess online", "chess"),
    ("woodworking", "a woodworking shop class", "building a bookshelf", "carpentry"),
    ("knitting", "a knitting circle", "knitting scarves", "yarn"),
]
INSTRUMENTS = ["cello", "ukulele", "piano", "violin", "drums", "saxophone"]
LANGUAGES = ["Spanish", "Japanese", "Italian", "Portuguese", "Korean", "German"]
CARS = [
    ("Honda", "Civic", "blue"),
    ("Toyota", "Corolla", "silver"),
    ("Subaru", "Outback", "green"),
    ("Mazda", "CX-5", "red"),
    ("Volkswagen", "Golf", "white"),
    ("Kia", "Niro", "grey"),
]
BOOKS = [
    ("Dune", "Frank Herbert"),
    ("Circe", "Madeline Miller"),
    ("The Overstory", "Richard Powers"),
    ("Educated", "Tara Westover"),
    ("Project Hail Mary", "Andy Weir"),
    ("Pachinko", "Min Jin Lee"),
    ("Middlemarch", "George Eliot"),
    ("The Remains of the Day", "Kazuo Ishiguro"),
]
ALLERGIES = [
    ("peanuts", "peanut"),
    ("shellfish", "shrimp"),
    ("penicillin", "antibiotic"),
    ("cats", "cat dander"),
    ("pollen", "hay fever"),
    ("gluten", "wheat"),
]
SIBLINGS = ["Anna", "Marco", "Julia", "Sam", "Nora", "Felix", "Clara", "Leo"]
SIB_JOBS = [
    ("paramedic", "ambulance"),
    ("lawyer", "law firm"),
    ("chef", "restaurant kitchen"),
    ("pilot", "airline"),
    ("veterinarian", "animal clinic"),
    ("electrician", "wiring"),
]
TRIPS = [
    ("Iceland", "hiking across glaciers"),
    ("Morocco", "wandering the souks in Marrakesh"),
    ("Japan", "visiting temples in Nara"),
    ("Peru", "trekking to Machu Picchu"),
    ("Norway", "kayaking in the fjords"),
    ("Vietnam", "eating street food in Hanoi"),
    ("Greece", "sailing between islands"),
    ("Chile", "stargazing in the Atacama desert"),
]
INJURIES = [
    ("knee", "tore a ligament in my knee", "physical therapy"),
    ("wrist", "sprained my wrist", "a brace"),
    ("back", "pulled a muscle in my lower back", "stretching exercises"),
    ("ankle", "twisted my ankle badly", "crutches"),
]
RACES = [
    ("half marathon", "21 km"),
    ("10K", "10 kilometers"),
    ("marathon", "42 km"),
    ("triathlon", "sprint distance"),
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]


@dataclass
class Turn:
    speaker: str  # "user" or "assistant"
    content: str
    fact: str | None = None  # fact key stated in this turn (evidence)


@dataclass
class Session:
    started_at: datetime
    turns: list[Turn] = field(default_factory=list)


@dataclass
class Question:
    text: str
    facts: list[str]
    category: str


class Chat:
    """One persona's history under construction."""

    def __init__(self, rng: random.Random, name: str, n_sessions: int) -> None:
        self.rng = rng
        self.name = name
        start = datetime(2023, 1, 4, 18, 30) + timedelta(days=rng.randrange(0, 60))
        self.sessions: list[Session] = []
        t = start
        for _ in range(n_sessions):
            self.sessions.append(Session(t))
            t += timedelta(days=rng.randrange(4, 14), hours=rng.randrange(-3, 4), minutes=rng.randrange(60))
        self.questions: list[Question] = []
        self.fact_sessions: dict[str, int] = {}

    def pick(self, seq):
        return self.rng.choice(seq)

    def state(self, key: str, session: int, statement: str, replies: list[str]) -> None:
        """Put a fact statement (user) and an assistant reply into session ``session``."""
        s = self.sessions[session]
        s.turns.append(Turn("user", statement, fact=key))
        s.turns.append(Turn("assistant", self.pick(replies)))
        self.fact_sessions[key] = session

    def ask(self, text: str, facts: list[str], category: str) -> None:
        self.questions.append(Question(text, facts, category))

    def month(self, key: str) -> str:
        return MONTHS[self.sessions[self.fact_sessions[key]].started_at.month - 1]


def slots(n: int, rng: random.Random, lo: int, hi: int, k: int) -> list[int]:
    """k distinct session indexes in [lo, hi), sorted."""
    return sorted(rng.sample(range(max(0, lo), min(n, hi)), k))


# --- fact families -------------------------------------------------------------------
# Each adds statements to sessions and questions about them. Statement, reply and
# question wordings are deliberately different (inflection, synonyms, pronouns).


def fam_pet(c: Chat, n: int) -> None:
    species, young, breed = c.pick(PETS)
    pet = c.pick(PET_NAMES)
    s = c.rng.randrange(2, n - 6)
    c.state(
        "pet",
        s,
        c.pick(
            [
                f"Big news, we're adopting a little {breed} {young} from the shelter this weekend!"
                f" We're naming her {pet}.",
                f"We finally brought home a {breed} {young} today. Her name is {pet} and she"
                " already chewed my slippers.",
                f"Guess what, I adopted a {young}! A tiny {breed} called {pet}.",
            ]
        ),
        [
            f"Congratulations on the new {species}! {pet} is a wonderful name.",
            f"How exciting! A {breed} is a great companion. Make sure {pet} gets her vaccinations early.",
            f"That's lovely. Young {species}s need a lot of sleep, so give {pet} a quiet corner.",
        ],
    )
    c.ask(
        c.pick(
            [
                f"What did I name my {species}?",
                f"What is my {species} called?",
                f"What's the name of the {species} I adopted?",
            ]
        ),
        ["pet"],
        "single-hop",
    )
    c.ask(
        c.pick(
            [
                f"Which breed is the {young} we got from the shelter?",
                f"What kind of {species} did I adopt?",
                f"What breed is {pet}?",
            ]
        ),
        ["pet"],
        "single-hop",
    )
    s2 = c.rng.randrange(s + 1, n)
    vet = c.pick(["ear infection", "upset stomach", "limp in her back leg", "skin rash"])
    c.state(
        "pet_vet",
        s2,
        c.pick(
            [
                f"Took {pet} to the vet this morning, turns out she has an {vet}. Poor girl.",
                f"Rough week: {pet} had a {vet} and we spent a fortune at the animal clinic.",
            ]
        ),
        [
            "Oh no, I hope she feels better soon. Keep an eye on her appetite.",
            "Vet visits are stressful. Did they prescribe any medication?",
        ],
    )
    c.ask(
        c.pick(
            [
                f"What health problem did my {species} have?",
                f"Why did I take my {young} to the veterinarian?",
                f"What was wrong with the {breed} when she saw the vet?",
            ]
        ),
        ["pet", "pet_vet"],
        "multi-hop",
    )


def fam_city(c: Chat, n: int) -> None:
    a, b = c.rng.sample(CITIES, 2)
    s1, s2 = slots(n, c.rng, 0, n - 2, 2)
    c.state(
        "city_a",
        s1,
        c.pick(
            [
                f"The weather in {a} has been miserable all week, I can't wait for spring.",
                f"Living in {a} is great but the rent keeps going up every year.",
                f"Walked along the river in {a} after work, it's my favourite part of the city.",
            ]
        ),
        ["That sounds like a lovely routine.", f"{a} does have its charm. Do you like your neighbourhood?"],
    )
    c.state(
        "city_b",
        s2,
        c.pick(
            [
                f"We finally relocated to {b}! The boxes are everywhere but it feels like home already.",
                f"I signed the lease and I'm moving to {b} next month, so exciting and terrifying.",
                f"First week after the move to {b}: found a great bakery two blocks from the new apartment.",
            ]
        ),
        [
            f"Congratulations on the move! {b} is a fantastic place to live.",
            "Relocating is a big step. Take your time settling in.",
        ],
    )
    c.ask(
        c.pick(
            [
                f"Where was I living before I moved to {b}?",
                "Which city did I live in before relocating?",
                "What town did I leave when I moved?",
            ]
        ),
        ["city_a"],
        "temporal",
    )
    c.ask(
        c.pick(
            [f"Which city did I move to after {a}?", "Where did I relocate to?", "Where is my new apartment?"]
        ),
        ["city_b"],
        "single-hop",
    )


def fam_job(c: Chat, n: int) -> None:
    (r1, co1, d1), (r2, co2, d2) = c.rng.sample(JOBS, 2)
    s1, s2, s3 = slots(n, c.rng, 0, n, 3)
    c.state(
        "job_a",
        s1,
        c.pick(
            [
                f"Long day at {co1} again. Being a {r1} means I spend most of my time {d1}.",
                f"My manager at {co1} asked me to stay late, {d1} never ends.",
            ]
        ),
        ["That sounds exhausting. Remember to take breaks.", "Do you enjoy the work itself?"],
    )
    c.state(
        "job_offer",
        s2,
        c.pick(
            [
                f"I got the offer! I'm joining {co2} as a {r2} starting on the first of the month.",
                f"Handed in my resignation at {co1} today, I accepted a {r2} position at {co2}.",
            ]
        ),
        [
            "Congratulations on the new role! That's a big career change.",
            f"Well deserved. What are you most looking forward to at {co2}?",
        ],
    )
    c.state(
        "job_b",
        s3,
        c.pick(
            [
                f"Three weeks into the new job and I love it. I'm {d2} and the team is really kind.",
                f"The onboarding at {co2} was intense, but now I'm mostly {d2}.",
            ]
        ),
        ["Glad the transition went smoothly!", "It sounds like a good fit for you."],
    )
    c.ask(
        c.pick(
            [
                "Where did I work before I switched jobs?",
                f"Which company did I leave for {co2}?",
                "What was my previous employer?",
            ]
        ),
        ["job_a"],
        "temporal",
    )
    c.ask(
        c.pick(
            [
                "What position did I accept at my new company?",
                f"What is my role at {co2}?",
                "Which job offer did I take?",
            ]
        ),
        ["job_offer"],
        "single-hop",
    )
    c.ask(
        c.pick(
            [
                "What do I do day to day in my current job?",
                "What tasks does my new work involve?",
                f"What am I working on at {co2}?",
            ]
        ),
        ["job_offer", "job_b"],
        "multi-hop",
    )


def fam_hobby(c: Chat, n: int) -> None:
    hobby, place, doing, topic = c.pick(HOBBIES)
    s1, s2 = slots(n, c.rng, 0, n, 2)
    c.state(
        "hobby",
        s1,
        c.pick(
            [
                f"I signed up for {place}, I've wanted to try {hobby} for years.",
                f"Started {hobby} this week! I joined {place} that meets on Tuesday evenings.",
            ]
        ),
        [
            f"That's a great way to unwind. {topic.capitalize()} can be very meditative.",
            "Trying something new is always exciting. Let me know how the first session goes.",
        ],
    )
    c.state(
        "hobby_progress",
        s2,
        c.pick(
            [
                f"Spent the whole Saturday {doing}, I think I'm finally getting the hang of it.",
                f"My instructor said my technique improved a lot. I've been {doing} every week.",
            ]
        ),
        ["Practice really pays off!", "That's wonderful progress."],
    )
    c.ask(
        c.pick(
            [
                "What new hobby did I take up?",
                "Which class did I enroll in?",
                "What activity did I start doing on Tuesday nights?",
            ]
        ),
        ["hobby"],
        "single-hop",
    )
    c.ask(
        c.pick(
            [
                "How am I progressing with my new hobby?",
                "What did I spend a Saturday practicing?",
                "What did my teacher say about my progress?",
            ]
        ),
        ["hobby", "hobby_progress"],
        "multi-hop",
    )


def fam_sibling(c: Chat, n: int) -> None:
    sib = c.pick(SIBLINGS)
    job, place = c.pick(SIB_JOBS)
    s1, s2 = slots(n, c.rng, 0, n, 2)
    c.state(
        "sib",
        s1,
        c.pick(
            [
                f"My sister {sib} is coming to stay with us for a few days, I need to clean the guest room.",
                f"Had a long phone call with my sister {sib} tonight, we hadn't talked in weeks.",
            ]
        ),
        ["It's nice to reconnect with family.", "Enjoy the time together!"],
    )
    c.state(
        "sib_job",
        s2,
        c.pick(
            [
                f"{sib} just finished her training and is officially a {job} now. So proud of her.",
                f"{sib} told me about her first week as a {job}, the hours sound brutal.",
            ]
        ),
        [
            f"That's a demanding career. Being a {job} takes real dedication.",
            "What an achievement, please pass on my congratulations.",
        ],
    )
    c.ask(
        c.pick(
            [
                "What does my sister do for a living?",
                "What is my sister's profession?",
                "What job did my sister train for?",
            ]
        ),
        ["sib", "sib_job"],
        "multi-hop",
    )
    c.ask(
        c.pick(
            [
                "What is my sister's name?",
                "Who is my sister?",
                "Which relative came to stay in the guest room?",
            ]
        ),
        ["sib"],
        "single-hop",
    )


def fam_car(c: Chat, n: int) -> None:
    (m1, mo1, col1), (m2, mo2, col2) = c.rng.sample(CARS, 2)
    s1, s2 = slots(n, c.rng, 0, n, 2)
    c.state(
        "car_a",
        s1,
        c.pick(
            [
                f"My old {m1} {mo1} broke down on the highway again, the mechanic says the transmission is dying.",
                f"The {col1} {m1} failed its inspection, I'm tired of pouring money into that car.",
            ]
        ),
        [
            "That's frustrating. It might be time to think about replacing it.",
            "Car trouble is the worst. Is it worth repairing at this point?",
        ],
    )
    c.state(
        "car_b",
        s2,
        c.pick(
            [
                f"I bought a {col2} {m2} {mo2} today! Traded in the old one.",
                f"Just picked up my new car, a {mo2}. The {col2} color looks great in the sun.",
            ]
        ),
        [
            "Congratulations on the new car! Enjoy the test drives.",
            f"Nice choice, the {mo2} has a good reputation for reliability.",
        ],
    )
    c.ask(
        c.pick(
            [
                "Which car did I buy?",
                "What vehicle did I purchase to replace my old one?",
                "What new car do I drive?",
            ]
        ),
        ["car_b"],
        "single-hop",
    )
    c.ask(
        c.pick(
            [
                "What car did I have before the new one?",
                "What was wrong with my previous car?",
                "Which car kept breaking down before I bought another?",
            ]
        ),
        ["car_a"],
        "temporal",
    )


def fam_books(c: Chat, n: int) -> None:
    picks = c.rng.sample(BOOKS, 3)
    for i, s in enumerate(slots(n, c.rng, 0, n, 3)):
        title, author = picks[i]
        key = f"book{i}"
        c.state(
            key,
            s,
            c.pick(
                [
                    f"I'm halfway through {title} by {author} and I can't put it down.",
                    f"Just started reading {title}, everyone at book club recommended it.",
                    f"Finished {title} last night. {author} really knows how to end a story.",
                ]
            ),
            ["That's a great pick, what do you think of it so far?", f"{author} is a fantastic writer."],
        )
        c.ask(f"Which book was I reading in {c.month(key)}?", [key], "temporal")
    c.ask("What books did I read this year?", ["book0", "book1", "book2"], "multi-hop")


def fam_allergy(c: Chat, n: int) -> None:
    allergen, related = c.pick(ALLERGIES)
    s = c.rng.randrange(0, n)
    c.state(
        "allergy",
        s,
        c.pick(
            [
                f"Ended up at urgent care after lunch, apparently I'm seriously allergic to {allergen}.",
                f"My doctor confirmed an allergy to {allergen}, so I have to carry an epipen now.",
            ]
        ),
        [
            f"That must have been scary. Always check labels for {related}.",
            "I'm glad you're okay. Allergic reactions can escalate quickly.",
        ],
    )
    c.ask(
        c.pick(
            [
                "What am I allergic to?",
                "Which allergy did the doctor diagnose?",
                "What food or substance gives me an allergic reaction?",
            ]
        ),
        ["allergy"],
        "single-hop",
    )


def fam_language(c: Chat, n: int) -> None:
    lang = c.pick(LANGUAGES)
    s1, s2 = slots(n, c.rng, 0, n, 2)
    c.state(
        "lang",
        s1,
        c.pick(
            [
                f"I've been learning {lang} with an app every morning, 40 days streak so far.",
                f"Signed up for evening {lang} lessons, my pronunciation is terrible.",
            ]
        ),
        ["Consistency is the key with languages!", "That's impressive dedication."],
    )
    c.state(
        "lang_test",
        s2,
        c.pick(
            [
                f"Passed my {lang} level B1 exam! All that studying paid off.",
                f"I had my first conversation entirely in {lang} with a waiter today.",
            ]
        ),
        ["Congratulations, that's a real milestone!", "Amazing, that must have felt great."],
    )
    c.ask(
        c.pick(
            [
                "Which language am I studying?",
                "What language have I been practicing?",
                "What language lessons did I sign up for?",
            ]
        ),
        ["lang"],
        "single-hop",
    )
    c.ask(
        c.pick(["What milestone did I reach with my language learning?", "Did I pass a language test?"]),
        ["lang_test"],
        "single-hop",
    )


def fam_trip(c: Chat, n: int) -> None:
    country, activity = c.pick(TRIPS)
    s1, s2 = slots(n, c.rng, 0, n, 2)
    c.state(
        "trip_plan",
        s1,
        c.pick(
            [
                f"Booked flights to {country} for the autumn! I've dreamed about {activity} forever.",
                f"We're planning a two week vacation in {country}, any tips?",
            ]
        ),
        [
            "What a great destination. Pack layers, the weather can change fast.",
            "How exciting! Make sure your passport is valid for six months.",
        ],
    )
    c.state(
        "trip_done",
        s2,
        c.pick(
            [
                f"Back from {country}! The highlight was definitely {activity}.",
                f"Still jet lagged after the trip. {activity.capitalize()} was the best part.",
            ]
        ),
        ["Welcome back! It sounds like an unforgettable holiday.", "I'd love to hear more about it."],
    )
    c.ask(
        c.pick(
            [
                "Where did I travel for my vacation?",
                "Which country did I visit on holiday?",
                "Where did I fly to in the autumn?",
            ]
        ),
        ["trip_plan"],
        "single-hop",
    )
    c.ask(
        c.pick(
            [
                "What was the best part of my trip?",
                "What did I enjoy most while traveling abroad?",
                "What was the highlight of my holiday?",
            ]
        ),
        ["trip_done"],
        "single-hop",
    )


def fam_injury(c: Chat, n: int) -> None:
    part, what, treat = c.pick(INJURIES)
    race, dist = c.pick(RACES)
    s1, s2, s3 = slots(n, c.rng, 0, n, 3)
    c.state(
        "race",
        s1,
        c.pick(
            [
                f"I registered for a {race} in the spring, training starts now.",
                f"Decided to run my first {race}, {dist} sounds insane but I'm doing it.",
            ]
        ),
        ["That's a great goal! Build up your mileage slowly.", "Exciting! Do you have a training plan?"],
    )
    c.state(
        "injury",
        s2,
        c.pick(
            [
                f"Disaster: I {what} during a training run. The doctor says weeks of {treat}.",
                f"I {what} on the stairs yesterday, so training is on hold.",
            ]
        ),
        ["I'm so sorry. Rest is the priority now.", "Injuries are frustrating, but recovery comes first."],
    )
    c.state(
        "recovery",
        s3,
        c.pick(
            [
                f"My {part} finally feels normal again, I ran 5 km without pain today!",
                f"Good news: the specialist cleared my {part}, I can start running again.",
            ]
        ),
        ["That's great news, ease back into it.", "Wonderful, take it slowly at first."],
    )
    c.ask(
        c.pick(
            [
                "What race was I training for?",
                "Which running event did I register for?",
                "What race did I sign up for?",
            ]
        ),
        ["race"],
        "single-hop",
    )
    c.ask(
        c.pick(
            [
                "How did I hurt myself while training?",
                "What injury interrupted my training?",
                f"What happened to my {part}?",
            ]
        ),
        ["injury"],
        "single-hop",
    )
    c.ask(
        c.pick(["When was I able to run again after getting injured?", "Did my injury heal?"]),
        ["injury", "recovery"],
        "temporal",
    )


def fam_instrument(c: Chat, n: int) -> None:
    inst = c.pick(INSTRUMENTS)
    teacher = c.pick(["Mrs. Alvarez", "Mr. Chen", "Ingrid", "a retired jazz musician"])
    s = c.rng.randrange(0, n)
    c.state(
        "instrument",
        s,
        c.pick(
            [
                f"I rented a {inst} and booked lessons with {teacher}. Never too late to learn music!",
                f"My fingers hurt from practicing the {inst}, {teacher} says that's normal.",
            ]
        ),
        ["Learning an instrument is so rewarding.", "Stick with it, the first months are the hardest."],
    )
    c.ask(
        c.pick(
            [
                "Which musical instrument am I learning to play?",
                "What instrument do I practice?",
                "Who teaches me music?",
            ]
        ),
        ["instrument"],
        "single-hop",
    )


def fam_partner(c: Chat, n: int) -> None:
    partner = c.pick(["Alex", "Jordan", "Chris", "Robin", "Sasha", "Jamie"])
    gift = c.pick(
        ["a vintage record player", "a cooking class for two", "a handmade photo album", "concert tickets"]
    )
    s1, s2 = slots(n, c.rng, 0, n, 2)
    c.state(
        "partner",
        s1,
        c.pick(
            [
                f"{partner} and I celebrated five years together with dinner at the Italian place downtown.",
                f"My partner {partner} surprised me with breakfast in bed this morning.",
            ]
        ),
        ["That's so sweet!", "Sounds like a wonderful evening."],
    )
    c.state(
        "gift",
        s2,
        c.pick(
            [
                f"I'm getting {partner} {gift} for the birthday, do you think that's a good idea?",
                f"Ordered {gift} as a present for {partner}, hope it arrives on time.",
            ]
        ),
        ["That's a thoughtful present.", "I'm sure they will love it."],
    )
    c.ask(
        c.pick(
            [
                "What present did I buy for my partner?",
                "What gift did I pick for my boyfriend's birthday?",
                "What birthday surprise did I plan?",
            ]
        ),
        ["gift"],
        "single-hop",
    )
    c.ask(
        c.pick(["What is my partner's name?", "Who am I in a relationship with?"]), ["partner"], "single-hop"
    )


def fam_home(c: Chat, n: int) -> None:
    room = c.pick(["kitchen", "bathroom", "living room", "balcony"])
    problem = c.pick(["a leaking pipe", "mold behind the tiles", "a broken heater", "cracked floorboards"])
    s1, s2 = slots(n, c.rng, 0, n, 2)
    c.state(
        "home_problem",
        s1,
        c.pick(
            [
                f"The landlord finally sent someone about {problem} in the {room}.",
                f"Woke up to {problem} in the {room}, what a mess.",
            ]
        ),
        [
            "That sounds stressful, I hope it gets fixed quickly.",
            "Make sure to document everything with photos.",
        ],
    )
    c.state(
        "home_reno",
        s2,
        c.pick(
            [
                f"We're renovating the {room}, picked out new cabinets and green tiles.",
                f"Painted the {room} a warm terracotta color this weekend, it looks brand new.",
            ]
        ),
        ["That sounds beautiful!", "A fresh color makes such a difference."],
    )
    c.ask(
        c.pick(
            [
                f"What repair issue did I have in my {room}?",
                "What broke in my apartment?",
                "What did the landlord need to fix?",
            ]
        ),
        ["home_problem"],
        "single-hop",
    )
    c.ask(
        c.pick(
            [
                "Which room did I redecorate?",
                "What part of the house did I remodel?",
                "What renovations did I do at home?",
            ]
        ),
        ["home_reno"],
        "single-hop",
    )


FAMILIES = [
    fam_pet,
    fam_city,
    fam_job,
    fam_hobby,
    fam_sibling,
    fam_car,
    fam_books,
    fam_allergy,
    fam_language,
    fam_trip,
    fam_injury,
    fam_instrument,
    fam_partner,
    fam_home,
]

# --- small talk and distractors ---------------------------------------------------------
SMALL_TALK = [
    ("Good morning! What's a quick breakfast idea?", "Overnight oats or yogurt with fruit take two minutes."),
    ("Can you remind me how to convert Fahrenheit to Celsius?", "Subtract 32 and multiply by five ninths."),
    ("I'm so tired today, didn't sleep well.", "Sorry to hear that. A short walk outside can help."),
    ("Any tips for staying focused while working from home?", "Try time blocks and a separate work corner."),
    ("What's a good movie for a rainy evening?", "A cozy classic like Paddington 2 never disappoints."),
    (
        "Help me write a polite email declining a meeting.",
        "Sure: thank them, decline briefly, offer an alternative.",
    ),
    ("How long should I boil an egg for a runny yolk?", "About six minutes, then into cold water."),
    ("I need a name for my fantasy football team.", "How about The Gridiron Gurus?"),
    (
        "What's the difference between baking soda and baking powder?",
        "Powder already contains an acid; soda needs one.",
    ),
    ("Remind me to drink more water, I always forget.", "Good idea: keep a bottle on your desk as a cue."),
    ("Can you suggest a podcast for my commute?", "Try a storytelling show like This American Life."),
    ("Ugh, Monday again.", "Hang in there, plan one small nice thing for tonight."),
    ("How do I get wine out of a carpet?", "Blot, then use cold water and a little dish soap."),
    ("What's a good stretch for a stiff neck?", "Slow chin tucks and side tilts, held for twenty seconds."),
    ("Give me a fun fact.", "Octopuses have three hearts."),
    ("I want to save more money this year.", "Automate a transfer to savings on payday."),
    ("Which houseplants are hard to kill?", "Snake plants and pothos tolerate almost anything."),
    (
        "I'm hosting friends on Saturday, what should I cook?",
        "A big pot of chili lets you spend time with guests.",
    ),
    (
        "How do I politely tell a coworker they talk too loud?",
        "Ask privately and frame it around your focus.",
    ),
    (
        "Is it normal to feel nervous before a presentation?",
        "Completely. Rehearse the opening line a few times.",
    ),
]
DISTRACTORS = [
    "My neighbour's dog barked all night, I barely slept.",
    "Are dog parks safe for small breeds?",
    "My coworker keeps showing me videos of her cat.",
    "The shelter near my office is hosting an adoption day.",
    "My friend is thinking about moving to another city for work.",
    "Rent prices are crazy everywhere right now.",
    "My cousin just bought a used car and it already needs new brakes.",
    "What's the best way to negotiate a salary offer?",
    "My brother complains about his job all the time.",
    "Do you think it's worth learning a language with an app?",
    "I saw a documentary about climbing last night.",
    "Our book club can't agree on the next book.",
    "My mom called to ask when I'm visiting.",
    "A friend of mine hurt her shoulder playing tennis.",
    "I keep seeing ads for pottery classes everywhere.",
    "The traffic on the highway this morning was unbelievable.",
    "My friend's vet bills are getting expensive.",
    "I should really call my sister more often.",
    "Someone at work ran a marathon last weekend.",
    "The heater in the office is broken again.",
    "I'm thinking about a weekend trip somewhere warm.",
    "My boss asked who wants to lead the new project.",
    "Do you have tips for a long flight?",
    "I read an article saying reading before bed helps sleep.",
    "Which music streaming service has the best playlists?",
    "We ordered takeout again, I need to cook more.",
    "My partner wants to repaint the bedroom.",
    "I'm curious how allergies develop in adults.",
    "My friend's new apartment has a huge balcony.",
    "What kind of gift do you get for a coworker leaving?",
]
DISTRACTOR_REPLIES = [
    "That's understandable.",
    "Good question, it depends on the situation.",
    "Interesting!",
    "I can see why that's on your mind.",
    "That happens more often than people think.",
    "Want me to look into some options?",
    "Sounds like a lot to deal with.",
]


def build_chat(rng: random.Random, idx: int, name: str) -> dict:
    n = rng.randrange(26, 34)
    c = Chat(rng, name, n)
    for fam in FAMILIES:
        fam(c, n)
    # Small talk and distractors around the facts; facts land at a random position.
    for s in c.sessions:
        facts = s.turns
        s.turns = []
        extra: list[Turn] = []
        for q, a in rng.sample(SMALL_TALK, rng.randrange(3, 7)):
            extra += [Turn("user", q), Turn("assistant", a)]
        for d in rng.sample(DISTRACTORS, rng.randrange(1, 4)):
            extra += [Turn("user", d), Turn("assistant", rng.choice(DISTRACTOR_REPLIES))]
        pairs = [facts[i : i + 2] for i in range(0, len(facts), 2)] + [
            extra[i : i + 2] for i in range(0, len(extra), 2)
        ]
        rng.shuffle(pairs)
        s.turns = [t for p in pairs for t in p]
        s.turns.insert(
            0, Turn("user", rng.choice(["Hi!", "Hey there", "Hello again", "Morning!", "Hi, quick chat?"]))
        )
        s.turns.insert(
            1,
            Turn("assistant", rng.choice(["Hi! How are you?", "Hello! What's up?", "Hey, good to see you."])),
        )

    evidence: dict[str, str] = {}
    sessions = []
    for si, s in enumerate(c.sessions):
        msgs = []
        for mi, t in enumerate(s.turns):
            mid = f"c{idx}-s{si}-m{mi}"
            msgs.append(
                {"id": mid, "speaker": name if t.speaker == "user" else "assistant", "content": t.content}
            )
            if t.fact:
                evidence[t.fact] = mid
        sessions.append({"id": f"c{idx}-s{si}", "started_at": s.started_at.isoformat(), "messages": msgs})
    questions = [
        {
            "id": f"c{idx}-q{qi}",
            "question": q.text,
            "evidence": [evidence[f] for f in q.facts],
            "category": q.category,
        }
        for qi, q in enumerate(c.questions)
    ]
    return {"sessions": sessions, "questions": questions}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--chats", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    total_q = total_m = 0
    for i in range(args.chats):
        chat = build_chat(rng, i, PERSONAS[i % len(PERSONAS)])
        path = args.out / f"chat_{i:02d}.json"
        path.write_text(json.dumps(chat, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        total_q += len(chat["questions"])
        total_m += sum(len(s["messages"]) for s in chat["sessions"])
    print(f"wrote {args.chats} chats, {total_m} messages, {total_q} questions to {args.out}")


if __name__ == "__main__":
    main()
