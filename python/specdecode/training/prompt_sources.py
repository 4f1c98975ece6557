"""Prompts beyond the request templates: code and prose requests, requests for long answers,
follow-ups for multi-turn exchanges, seed topics for self-instruct, and the guard that keeps the
benchmark's prompts out of all of them.

Every list here is written for this kit (nothing is downloaded). The sources that need the
target itself (self-instruct requests, multi-turn exchanges) are in
:mod:`specdecode.training.widen`; it mixes them with these.

The benchmark's prompts (:mod:`specdecode.prompt_sets`: the chat sets and the code and
prose sets, both halves) stay out of training: :func:`is_held_out` says whether a text is one of
them or a near-copy (the same content words, or most of one's content words in the same order:
the longest common word subsequence, as ROUGE-L counts it), and every source drops such texts.
"""

from __future__ import annotations

import itertools
import re
from functools import lru_cache

import torch

from specdecode.prompt_sets import CHAT_PROMPT_SETS, PROMPT_SETS

__all__ = ["FOLLOW_UPS", "SEED_TOPICS", "code_requests", "content_words", "held_out_prompts", "is_held_out",
           "long_requests", "near_copy", "prose_requests", "rouge_l", "static_source"]

#: Topics the target writes its own requests about (self-instruct), one request per draw.
SEED_TOPICS: tuple[str, ...] = (
    "astronomy", "baking", "personal finance", "job hunting", "public transport", "houseplants", "ancient Egypt",
    "video games", "mental health", "photography", "electric cars", "chemistry homework", "wedding planning",
    "camping", "spreadsheets", "jazz music", "learning Spanish", "home repairs", "climate change", "poetry",
    "web development", "dinosaurs", "nutrition", "small business", "board games", "space travel", "knitting",
    "world geography", "statistics", "cybersecurity", "birdwatching", "moving to a new country", "yoga",
    "renewable energy", "the Middle Ages", "writing fiction", "cooking with kids", "algorithms", "volunteering",
    "coffee", "football", "painting with watercolors", "time management", "the human brain", "recycling",
    "shell scripting", "ocean life", "mythology", "philosophy", "retirement savings", "tea ceremonies",
    "first aid", "architecture", "cycling", "mobile apps", "insects", "classical music", "negotiation",
    "data visualization", "vegetarian cooking", "the solar system", "friendship", "kitchen gadgets",
    "road safety", "graphic design", "linear algebra", "parenting teenagers", "hiking boots", "robots",
    "museums", "card tricks", "the printing of books", "cheese", "weather", "languages of the world",
    "unit testing", "airports", "sleep", "online privacy", "carpentry", "family history", "the Arctic",
    "opera", "public speaking", "spices", "rivers", "the stock exchange", "puzzles", "fashion history",
    "game design", "gardening tools", "volcanology", "remote teams", "bread", "medieval castles",
    "typography", "the metric system", "marine biology", "comics", "smartphones", "climbing", "bees",
    "budget travel", "ethics of technology", "origami", "lighthouses of the past", "trains", "chess openings",
)

#: Second user turns of multi-turn exchanges (after the target's first answer).
FOLLOW_UPS: tuple[str, ...] = (
    "Can you give me an example?", "Make it shorter, please.", "Can you explain that more simply?",
    "Turn that into a bulleted list.", "Tell me more about the first point.", "Why is that?",
    "What are the most common mistakes?", "Can you make it sound more formal?", "And what about for beginners?",
    "Summarize that in one sentence.", "Can you add a few more details?", "What would you do differently?",
    "Rewrite it in a friendlier tone.", "Give me three more ideas like that.", "How long would that take?",
    "Is there a cheaper way?", "Can you write it as a short poem instead?", "What is the hardest part?",
    "Explain the last step again.", "Can you put that in a table?", "What should I avoid?",
    "How would you explain that to a child?", "Thanks! Can you translate the first sentence into French?",
    "Which of those is the most important?", "Continue, please.", "Can you check that for errors?",
    "What are the alternatives?", "Now write the opposite point of view.", "Can you add a title?",
    "Could you make it funnier?",
)

_CODE_TASKS = ("Explain what this code does:", "Find the bug in this code and fix it:",
               "Add comments to this code:", "Rewrite this code to make it easier to read:",
               "Write unit tests for this code:", "What is the time complexity of this code?",
               "Translate this code into {other}:", "Complete this code:")
_SNIPPETS: tuple[tuple[str, str], ...] = (
    ("Python", "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)"),
    ("Python", "def chunks(items, size):\n    return [items[i:i + size] for i in range(0, len(items), size)]"),
    ("Python", "class Counter:\n    def __init__(self):\n        self.n = 0\n\n    def tick(self):\n        self.n += 1"),
    ("Python", "def is_sorted(xs):\n    return all(a <= b for a, b in zip(xs, xs[1:]))"),
    ("Python", "def word_lengths(text):\n    return {w: len(w) for w in text.split()}"),
    ("JavaScript", "function debounce(fn, ms) {\n  let t;\n  return (...args) => {\n    clearTimeout(t);\n"
                   "    t = setTimeout(() => fn(...args), ms);\n  };\n}"),
    ("JavaScript", "const total = cart.reduce((sum, item) => sum + item.price * item.qty, 0);"),
    ("JavaScript", "async function getUser(id) {\n  const res = await fetch(`/api/users/${id}`);\n  return res.json();\n}"),
    ("C", "int max(int *a, int n) {\n    int m = a[0];\n    for (int i = 1; i <= n; i++)\n        if (a[i] > m) m = a[i];\n"
          "    return m;\n}"),
    ("C", "void swap(int *x, int *y) {\n    int t = *x;\n    *x = *y;\n    *y = t;\n}"),
    ("Rust", "fn squares(n: u32) -> Vec<u32> {\n    (1..=n).map(|i| i * i).collect()\n}"),
    ("Rust", "fn first_word(s: &str) -> &str {\n    s.split_whitespace().next().unwrap_or(\"\")\n}"),
    ("Go", "func sum(nums []int) int {\n\ts := 0\n\tfor _, n := range nums {\n\t\ts += n\n\t}\n\treturn s\n}"),
    ("SQL", "SELECT city, COUNT(*) AS shops\nFROM stores\nGROUP BY city\nHAVING COUNT(*) > 3\nORDER BY shops DESC;"),
    ("Java", "public static boolean isEven(int n) {\n    return n % 2 == 0;\n}"),
    ("Bash", "for f in *.jpg; do\n  convert \"$f\" -resize 50% \"small_$f\"\ndone"),
)
_OTHER = {"Python": "JavaScript", "JavaScript": "Python", "C": "Rust", "Rust": "Go", "Go": "Python",
          "SQL": "Python with pandas", "Java": "Kotlin", "Bash": "Python"}

_PROSE_TASKS = ("Continue this story:", "Rewrite this paragraph in simpler words:", "Summarize this paragraph:",
                "Make this paragraph more vivid:", "Write the next paragraph:", "Correct the grammar of this text:",
                "Turn this into a formal letter:", "What is the mood of this passage?")
_WHO = ("My grandfather", "The new teacher", "A young fisherman", "The mayor of our town", "An old musician",
        "Our neighbor's daughter", "A tired nurse", "The shop owner")
_DID = ("found a map hidden in a library book", "decided to walk across the country",
        "opened a bakery on a street where nobody shopped", "lost the only key to the school",
        "started writing letters to strangers", "planted a tree every spring for forty years",
        "heard a strange song coming from the hills", "missed the last train home")
_THEN = ("Nobody believed it at first.", "It changed everything that summer.", "The whole town was talking about it.",
         "It began on an ordinary Tuesday.", "Years later, people still tell the story.")

_LONG = ("Write a detailed guide to {task}, with sections and tips.", "Write a long essay about {concept}.",
         "Explain {concept} in depth, with examples, common misconceptions and a summary.",
         "Write a complete lesson plan that teaches {concept}.",
         "Give me a thorough, step-by-step plan to {task}, and explain each step.",
         "Write a long story about {subject}, with dialogue.")


def _seeded_pick(texts: list[str], count: int, seed: int) -> list[str]:
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    return [texts[order[i % len(order)]] for i in range(count)]


def code_requests() -> list[str]:
    """Requests about code (explain, fix, comment, test, translate, complete) on short snippets
    in several languages."""
    out = []
    for task, (lang, code) in itertools.product(_CODE_TASKS, _SNIPPETS):
        fence = lang.lower().split()[0]
        out.append(f"{task.format(other=_OTHER[lang])}\n\n```{fence}\n{code}\n```")
    return out


def prose_requests() -> list[str]:
    """Requests about prose (continue, rewrite, summarize, correct) on short paragraphs."""
    texts = [f"{who} {did}. {then}" for who, did, then in itertools.product(_WHO, _DID, _THEN)]
    return [f"{task}\n\n{text}" for task, text in zip(itertools.cycle(_PROSE_TASKS), texts)]


def long_requests() -> list[str]:
    """Requests whose answers are long (guides, essays, lesson plans, stories)."""
    from specdecode.training.prompts import topic_lists

    lists = topic_lists()
    out = []
    for template in _LONG:
        if "{task}" in template:
            out += [template.format(task=t) for t in lists["tasks"]]
        elif "{concept}" in template:
            out += [template.format(concept=c) for c in lists["concepts"]]
        else:
            out += [template.format(subject=s) for s in lists["subjects"]]
    return out


def static_source(name: str, count: int, seed: int) -> list[str]:
    """``count`` requests of source ``name`` (``"code"``, ``"prose"`` or ``"long"``) in a
    seeded order, the benchmark's prompts left out."""
    makers = {"code": code_requests, "prose": prose_requests, "long": long_requests}
    if name not in makers:
        raise ValueError(f"name: expected one of {', '.join(makers)}, got {name!r}")
    texts = [t for t in makers[name]() if not is_held_out(t)]
    return _seeded_pick(texts, count, seed)


_FUNCTION_WORDS = frozenset(
    "a an the is are was were be to of in on at for and or but with about from by as it its this that these those "
    "what which who how why when where do does did can could would should will i me my you your we our "
    "they their he she his her there here some any".split())


def content_words(text: str) -> list[str]:
    """The content words of ``text``, lowercased, a plural's final s dropped (all its words
    when it has no others)."""
    words = [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
             for w in re.findall(r"[a-z0-9]+", text.lower())]
    content = [w for w in words if w not in _FUNCTION_WORDS]
    return content or words


def rouge_l(a: list[str], b: list[str]) -> tuple[float, float]:
    """``(f, recall_of_b)``: ROUGE-L's F-measure of two word lists (their longest common
    subsequence over their lengths) and the share of ``b``'s words in that subsequence."""
    if not a or not b:
        return 0.0, 0.0
    previous = [0] * (len(b) + 1)
    for x in a:
        row = [0]
        for j, y in enumerate(b):
            row.append(previous[j] + 1 if x == y else max(previous[j + 1], row[j]))
        previous = row
    lcs = previous[-1]
    precision, recall = lcs / len(a), lcs / len(b)
    return (0.0 if lcs == 0 else 2 * precision * recall / (precision + recall)), recall


def near_copy(text: str, other: str, threshold: float = 0.75) -> bool:
    """Whether ``text`` is ``other`` or a near-copy of it, over their content words (function
    words such as "the", "what", "is" left out, so that two requests of one template on
    different subjects differ): ROUGE-L F at least ``threshold``, or at least 80% of
    ``other``'s words in ``text`` in the same order (``other`` inside a longer text)."""
    a, b = content_words(text), content_words(other)
    if not a or not b:
        return False
    if len(set(a) & set(b)) < 0.6 * len(set(b)) and len(set(a) & set(b)) < threshold * len(set(a)):
        return False  # too few shared words for either test: skip the quadratic part
    f, recall = rouge_l(a, b)
    return f >= threshold or recall >= 0.8


@lru_cache(maxsize=1)
def held_out_prompts() -> tuple[str, ...]:
    """The benchmark's prompts that training keeps out: every chat request and every code and
    prose prompt of :mod:`specdecode.prompt_sets`, tune and report halves."""
    texts = [p for half in CHAT_PROMPT_SETS.values() for p in half]
    texts += [p for name, prompts in PROMPT_SETS.items() if "-" in name for p in prompts]
    return tuple(texts)


def is_held_out(text: str) -> bool:
    """Whether ``text`` is one of the benchmark's prompts (chat, code or prose, tune or report
    half) or a near-copy of one (:func:`near_copy`)."""
    return any(near_copy(text, held) for held in held_out_prompts())
