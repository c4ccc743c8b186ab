"""Generate a second development set: long two-person conversations (seeded).

    python bench/make_dialogues.py [--seed 11] [--chats 10] [--out /tmp/dialogues]

Why a second, generated set: the public multi-session dialogue datasets with evidence
annotations that were looked at could not be obtained here (LongMemEval keeps its
data on Hugging Face, not in its GitHub repository; PerLTQA's GitHub repository holds
the data but its large files are not in the mirror, and it is CC BY-NC; LoCoMo is
reserved for held-out evaluation). So this set imitates the *shape* of those
benchmarks, unlike ``bench/data`` (one user and an assistant):

* two named friends talk over ~8 months, 24 dated sessions of ~20-30 turns; they tell
  each other what happened ("I took a pottery class yesterday"), the other answers in
  other words, and much of the rest is small talk and distractors on the same topics;
* questions are asked in the third person with the speakers' names, as a reader of the
  conversation would ask: ``When did Caroline take a pottery class?`` (``temporal``:
  the answer is the session's date), ``What did Caroline make …?`` (``single-hop``),
  ``What outdoor activities has Caroline done?`` (``multi-hop``: two or three turns in
  different sessions), ``Would Caroline enjoy a ceramics workshop?`` (``open-domain``:
  the evidence shares few words with the question).

Files ``dlg_00`` .. ``dlg_04`` are the tuning split, ``dlg_05`` .. are the report split
(``--split dev|test`` writes only one of them). The generator knows nothing about the
retrievers.
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import datetime, timedelta
from pathlib import Path

NAMES = [
    "Caroline",
    "Melanie",
    "Jon",
    "Gina",
    "Evan",
    "Sam",
    "Joanna",
    "Nate",
    "Audrey",
    "Andrew",
    "Maria",
    "John",
    "Deborah",
    "Jolene",
    "Tim",
    "Calvin",
    "Dave",
    "Priya",
    "Hector",
    "Yuki",
]
WHEN = [
    "yesterday",
    "last weekend",
    "last Saturday",
    "on Friday",
    "this morning",
    "last week",
    "a few days ago",
]
PLACES = [
    "the community center",
    "a studio downtown",
    "the library",
    "the park by the river",
    "my friend's place",
    "the old warehouse",
    "the town square",
    "the beach",
]

# Each event: theme (for multi-hop questions), what the speaker says, what the friend
# replies, an optional later follow-up, and questions (category, template, which turns).
EVENTS = [
    dict(
        theme="creative",
        say="I took a pottery class at {place} {when}. I made a little {x}!",
        x=["bowl", "mug", "vase"],
        reply=["That's awesome! Working with clay must be so calming.", "Wow, handmade stuff is the best."],
        follow="The {x} from the class came out a bit lopsided but I use it every day.",
        qs=[
            ("temporal", "When did {A} take a pottery class?", "s"),
            ("single-hop", "What did {A} make in pottery class?", "s"),
            ("open-domain", "Would {A} enjoy a ceramics workshop?", "s"),
            ("multi-hop", "What has {A} done with the thing {P} made in class?", "sf"),
        ],
    ),
    dict(
        theme="creative",
        say="I finally finished painting that {x} I told you about, it's hanging in my hallway now.",
        x=["sunset over the lake", "portrait of my grandma", "field of sunflowers"],
        reply=["I'd love to see it sometime!", "You're so talented, seriously."],
        qs=[("single-hop", "What did {A} paint?", "s"), ("temporal", "When did {A} finish a painting?", "s")],
    ),
    dict(
        theme="outdoor",
        say="We went camping at {x} {when}. The stars were unreal.",
        x=["Lake Tahoe", "Yosemite", "the Smoky Mountains"],
        reply=["Sleeping under the sky sounds amazing.", "Did you see any wildlife out there?"],
        follow="Yeah, we saw a family of deer right by the tent at {x}.",
        qs=[
            ("temporal", "When did {A} go camping?", "s"),
            ("single-hop", "Where did {A} go camping?", "s"),
            ("single-hop", "What animals did {A} see while camping?", "f"),
        ],
    ),
    dict(
        theme="outdoor",
        say="I ran my first {x} {when}! My legs are still sore.",
        x=["5K", "half marathon", "charity race"],
        reply=["Congrats!! That's a huge milestone.", "So proud of you, how did you feel at the finish?"],
        qs=[
            ("temporal", "When did {A} run a race?", "s"),
            ("single-hop", "What race did {A} run?", "s"),
            ("open-domain", "Is {A} into fitness?", "s"),
        ],
    ),
    dict(
        theme="outdoor",
        say="I went hiking up {x} {when} with my brother.",
        x=["Mount Tam", "Eagle Peak", "the ridge trail"],
        reply=["The view from the top must have been worth it.", "Nice, I haven't been on a trail in ages."],
        qs=[("single-hop", "Who did {A} go hiking with?", "s"), ("temporal", "When did {A} go hiking?", "s")],
    ),
    dict(
        theme="family",
        say="My daughter {x} turned {n} {when}, we threw a small party.",
        x=["Lily", "Emma", "Zoe"],
        n=["five", "seven", "ten"],
        reply=["Happy birthday to her! Time flies.", "Aww, kids grow up so fast."],
        qs=[
            ("single-hop", "How old did {A}'s daughter turn?", "s"),
            ("temporal", "When was the birthday party for {A}'s daughter?", "s"),
            ("single-hop", "What is the name of {A}'s daughter?", "s"),
        ],
    ),
    dict(
        theme="family",
        say="My parents came to visit {when} from {x}.",
        x=["Ohio", "Manila", "Lagos", "Lisbon"],
        reply=["That's lovely, how long are they staying?", "It's always nice having family around."],
        follow="They're staying two weeks, my mom is already reorganizing my kitchen.",
        qs=[
            ("single-hop", "Where do {A}'s parents live?", "s"),
            ("temporal", "When did {A}'s parents visit?", "s"),
            ("multi-hop", "How long did {A}'s parents stay and where did they come from?", "sf"),
        ],
    ),
    dict(
        theme="family",
        say="We adopted a {x} from the shelter {when}, we named him {y}.",
        x=["puppy", "kitten", "rescue dog"],
        y=["Oscar", "Biscuit", "Max", "Pepper"],
        reply=["A new furry friend! Send pics please.", "Shelter animals are the sweetest."],
        follow="{y} chewed up my favorite sneakers, but I can't stay mad at him.",
        qs=[
            ("single-hop", "What is the name of {A}'s pet?", "s"),
            ("temporal", "When did {A} adopt a pet?", "s"),
            ("single-hop", "What did {A}'s pet destroy?", "f"),
            ("open-domain", "Does {A} like animals?", "s"),
        ],
    ),
    dict(
        theme="work",
        say="I got promoted to {x} {when}!",
        x=["team lead", "senior designer", "head nurse"],
        reply=["You totally deserve it, congrats!", "That's huge, drinks on me next time."],
        qs=[
            ("single-hop", "What position was {A} promoted to?", "s"),
            ("temporal", "When did {A} get promoted?", "s"),
        ],
    ),
    dict(
        theme="work",
        say="I started volunteering at {x} {when}, helping out twice a week.",
        x=["a youth shelter", "the food bank", "an animal rescue"],
        reply=["That's such a kind way to spend your time.", "How did you get involved with them?"],
        follow="I got involved because a friend of mine was helped by {x} years ago.",
        qs=[
            ("single-hop", "Where does {A} volunteer?", "s"),
            ("temporal", "When did {A} start volunteering?", "s"),
            ("multi-hop", "Why did {A} start volunteering and how often?", "sf"),
            ("open-domain", "Would {A} be considered a caring person?", "s"),
        ],
    ),
    dict(
        theme="work",
        say="I gave a talk about {x} at a conference {when}. I was so nervous.",
        x=["mental health", "renewable energy", "urban gardening"],
        reply=["I bet you nailed it.", "Public speaking is terrifying, good for you."],
        qs=[
            ("single-hop", "What did {A} talk about at the conference?", "s"),
            ("temporal", "When did {A} give a talk?", "s"),
        ],
    ),
    dict(
        theme="travel",
        say="Just got back from {x}! The food was incredible.",
        x=["Tokyo", "Mexico City", "Rome", "Barcelona"],
        reply=["Jealous! What was the best thing you ate?", "Welcome back! I need a trip like that."],
        follow="Best thing I ate in {x} was at a tiny street stall, still dreaming about it.",
        qs=[
            ("single-hop", "Where did {A} travel to?", "s"),
            ("temporal", "When did {A} return from a trip?", "s"),
            ("single-hop", "Where did {A} have the best food on the trip?", "f"),
        ],
    ),
    dict(
        theme="travel",
        say="I booked a trip to {x} for next month, my first time abroad alone.",
        x=["Iceland", "Peru", "Vietnam"],
        reply=[
            "Solo travel is life changing, you'll love it.",
            "Wow, brave! Make sure to share your itinerary.",
        ],
        qs=[
            ("single-hop", "Where is {A} planning to travel alone?", "s"),
            ("open-domain", "Is {A} adventurous?", "s"),
        ],
    ),
    dict(
        theme="music",
        say="I started learning {x} {when}, my neighbours must hate me.",
        x=["the violin", "the drums", "the ukulele"],
        reply=["Ha! Everyone starts somewhere.", "That's so cool, music is good for the soul."],
        qs=[
            ("single-hop", "What instrument is {A} learning?", "s"),
            ("temporal", "When did {A} start learning an instrument?", "s"),
            ("open-domain", "Would {A} enjoy going to a concert?", "s"),
        ],
    ),
    dict(
        theme="music",
        say="We saw {x} live {when}, best concert of my life.",
        x=["Taylor Swift", "Coldplay", "the local symphony"],
        reply=["No way, I'm so jealous!", "Live music hits different."],
        qs=[
            ("single-hop", "Who did {A} see in concert?", "s"),
            ("temporal", "When did {A} go to a concert?", "s"),
        ],
    ),
    dict(
        theme="health",
        say="I sprained my {x} playing soccer {when}, so I'm on crutches for a while.",
        x=["ankle", "knee", "wrist"],
        reply=["Oh no, take care of yourself!", "Ouch, rest up and don't push it."],
        follow="The doctor said my {x} needs six weeks of physical therapy.",
        qs=[
            ("single-hop", "What did {A} injure?", "s"),
            ("temporal", "When did {A} get injured?", "s"),
            ("multi-hop", "How did {A} get hurt and how long is the recovery?", "sf"),
        ],
    ),
    dict(
        theme="health",
        say="I've been doing yoga every morning since {when}, it really helps with stress.",
        x=[""],
        reply=["I should try that, my stress is through the roof.", "Mornings are the best time for it."],
        qs=[
            ("single-hop", "How does {A} deal with stress?", "s"),
            ("open-domain", "Would {A} enjoy a meditation retreat?", "s"),
        ],
    ),
    dict(
        theme="home",
        say="We moved into a new apartment in {x} {when}!",
        x=["Brooklyn", "the Mission district", "Capitol Hill"],
        reply=["Congrats on the new place!", "Moving is exhausting, hope you're settling in."],
        follow="The apartment in {x} has a balcony, I'm going to grow tomatoes there.",
        qs=[
            ("single-hop", "Where did {A} move to?", "s"),
            ("temporal", "When did {A} move?", "s"),
            ("single-hop", "What does {A} want to grow on the balcony?", "f"),
        ],
    ),
    dict(
        theme="home",
        say="I redid my whole garden {when}, planted {x}.",
        x=["roses and lavender", "vegetables and herbs", "succulents"],
        reply=["Gardening is so rewarding.", "That sounds beautiful."],
        qs=[
            ("single-hop", "What did {A} plant in the garden?", "s"),
            ("open-domain", "Does {A} like being outdoors?", "s"),
        ],
    ),
    dict(
        theme="learning",
        say="I signed up for a {x} course {when}, classes are on Tuesdays.",
        x=["Spanish", "photography", "coding"],
        reply=["Learning new things keeps you young.", "Oh fun, let me know how it goes."],
        follow="The {x} teacher is great, we had our first assignment already.",
        qs=[
            ("single-hop", "What course did {A} sign up for?", "s"),
            ("temporal", "When did {A} sign up for a course?", "s"),
            ("single-hop", "What day are {A}'s classes?", "s"),
        ],
    ),
    dict(
        theme="learning",
        say="I just finished reading {x}, couldn't put it down.",
        x=["Becoming", "Dune", "The Night Circus"],
        reply=["I've heard great things about it!", "Adding it to my list."],
        qs=[("single-hop", "What book did {A} read?", "s"), ("open-domain", "Does {A} like reading?", "s")],
    ),
    dict(
        theme="identity",
        say="I went to a support group for {x} {when}, it was really moving.",
        x=["new parents", "people who lost someone", "LGBTQ youth"],
        reply=["I'm glad you found people who get it.", "That takes courage, proud of you."],
        qs=[
            ("temporal", "When did {A} go to a support group?", "s"),
            ("single-hop", "What kind of support group did {A} attend?", "s"),
            ("open-domain", "Would {A} support a friend going through a hard time?", "s"),
        ],
    ),
]

SMALL = [
    "Hey! How's your week going?",
    "Pretty good, busy as always.",
    "Same here, work is crazy.",
    "Haha I know the feeling.",
    "Anyway, what's new with you?",
    "Not much honestly.",
    "I'm so tired today.",
    "Coffee is the only thing keeping me going.",
    "Did you watch the game?",
    "No, I missed it.",
    "The weather has been gorgeous lately.",
    "Ugh, it's been raining nonstop here.",
    "Talk soon!",
    "Bye, take care!",
    "Good to hear from you.",
    "Let's catch up again next week.",
    "That's so true.",
    "I know right?",
    "Totally agree.",
    "Sounds like a plan.",
    "Lol yes.",
    "Thanks for listening, really.",
    "What are your plans for the weekend?",
    "Probably just relaxing at home.",
    "Same, I need a quiet one.",
]
# Same topics, no fact: matching a topic word is not enough.
DISTRACT = [
    "My cousin does pottery, I've never tried clay myself.",
    "I keep meaning to go camping but never do.",
    "Do you think running is bad for your knees?",
    "My coworker's kid had a birthday party too, total chaos.",
    "I'd love to adopt a dog someday but my lease says no pets.",
    "Promotions at my job are so rare.",
    "I used to paint in college but stopped.",
    "Concert tickets are so expensive these days.",
    "My friend moved to a new apartment and hates it.",
    "I've been thinking about learning Spanish.",
    "Have you read anything good lately?",
    "Travel is on hold for me this year.",
    "My garden is a disaster honestly.",
    "Yoga never really clicked for me.",
    "I twisted my ankle once, it took forever to heal.",
    "Volunteering sounds nice but I have zero free time.",
    "My parents never visit, they hate flying.",
    "I can't sing or play anything, zero musical talent.",
    "Hiking trails around here are always crowded.",
    "Conferences are so draining.",
    "Support groups are great, my aunt goes to one.",
]
FOLLOW_ASK = [
    "Any news since last time?",
    "So how did that thing go?",
    "Tell me more about it!",
    "What happened after?",
]
MULTI = {
    "outdoor": "What outdoor activities has {A} done?",
    "creative": "What creative things has {A} made?",
    "family": "What family events has {A} mentioned?",
    "work": "What has happened in {A}'s work life?",
    "travel": "What trips has {A} talked about?",
    "music": "What musical things has {A} done?",
    "health": "What health issues or habits has {A} mentioned?",
    "home": "What has {A} done at home?",
    "learning": "What has {A} been learning?",
}


def build(rng: random.Random, idx: int) -> dict:
    a, b = rng.sample(NAMES, 2)
    n = 24
    t = datetime(2022, 3, 1, 14, 0) + timedelta(days=rng.randrange(0, 200))
    sessions: list[list[tuple[str, str, str | None]]] = []  # (speaker, text, tag)
    dates = []
    for _ in range(n):
        dates.append(t)
        sessions.append([])
        t += timedelta(days=rng.randrange(4, 16), hours=rng.randrange(-4, 5))
    questions: list[tuple[str, str, list[str]]] = []
    themes: dict[tuple[str, str], list[str]] = {}
    for who, other in ((a, b), (b, a)):
        for ei, ev in enumerate(rng.sample(EVENTS, 13)):
            fill = {k: rng.choice(v) for k, v in ev.items() if k in ("x", "y", "n")}
            fill["place"] = rng.choice(PLACES)
            fill["when"] = rng.choice(WHEN)
            s = rng.randrange(0, n - 4)
            tag = f"{who}-{ei}"
            sessions[s].append((who, ev["say"].format(**fill), tag + "-s"))
            sessions[s].append((other, rng.choice(ev["reply"]).format(**fill), None))
            if "follow" in ev:
                f = rng.randrange(s + 1, n)
                sessions[f].append((other, rng.choice(FOLLOW_ASK), None))
                sessions[f].append((who, ev["follow"].format(**fill), tag + "-f"))
            themes.setdefault((who, ev["theme"]), []).append(tag + "-s")
            for cat, q, turns in ev["qs"]:
                if "f" in turns and "follow" not in ev:
                    continue
                ev_tags = [tag + "-" + c for c in turns]
                questions.append((cat, q.format(A=who, P=who), ev_tags))
    for (who, theme), tags in themes.items():
        if len(tags) >= 2 and theme in MULTI:
            questions.append(("multi-hop", MULTI[theme].format(A=who), tags))
    out_sessions = []
    tag_to_id: dict[str, str] = {}
    for si, turns in enumerate(sessions):
        msgs = []
        # Interleave: greeting, facts with small talk and distractors between them.
        body = [turns[i : i + 2] for i in range(0, len(turns), 2)]
        seq: list[tuple[str, str, str | None]] = [
            (a, rng.choice(SMALL[:2]), None),
            (b, rng.choice(SMALL[1:6]), None),
        ]
        for chunk in body:
            seq += chunk
            for _ in range(rng.randrange(1, 4)):
                seq.append((rng.choice((a, b)), rng.choice(SMALL), None))
            if rng.random() < 0.6:
                seq.append((rng.choice((a, b)), rng.choice(DISTRACT), None))
        while len(seq) < 18:
            seq.append((rng.choice((a, b)), rng.choice(SMALL + DISTRACT), None))
        seq.append((a, rng.choice(SMALL[12:16]), None))
        for mi, (who, text, tag) in enumerate(seq):
            mid = f"d{idx}-s{si}-m{mi}"
            msgs.append({"id": mid, "speaker": who, "content": text})
            if tag:
                tag_to_id[tag] = mid
        out_sessions.append(
            {
                "id": f"d{idx}-s{si}",
                "started_at": dates[si].strftime("%I:%M %p on %d %B, %Y").lstrip("0"),
                "messages": msgs,
            }
        )
    qs = []
    for qi, (cat, q, tags) in enumerate(questions):
        ev = [tag_to_id[t] for t in tags if t in tag_to_id]
        if ev:
            qs.append({"id": f"d{idx}-q{qi}", "question": q, "evidence": ev, "category": cat})
    return {"sessions": out_sessions, "questions": qs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--chats", type=int, default=10)
    ap.add_argument("--split", choices=("all", "dev", "test"), default="all")
    ap.add_argument("--out", type=Path, default=Path("/tmp/dialogues"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    for i in range(args.chats):
        chat = build(rng, i)
        split = "dev" if i < args.chats // 2 else "test"
        if args.split not in ("all", split):
            continue
        folder = args.out / split
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"dlg_{i:02d}.json").write_text(
            json.dumps(chat, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        print(
            f"{folder / f'dlg_{i:02d}.json'}: {sum(len(s['messages']) for s in chat['sessions'])} messages,"
            f" {len(chat['questions'])} questions"
        )


if __name__ == "__main__":
    main()
