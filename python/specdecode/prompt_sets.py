"""The benchmark's held-out prompt sets: data only, importing nothing from specdecode.

They live here, below both :mod:`specdecode.bench` (which runs on them) and
:mod:`specdecode.training` (which keeps them out of every training prompt,
:func:`specdecode.training.prompt_sources.is_held_out`), so that neither imports the other.

**Code and prose** sets for the tree benchmark, of kinds the demo pair's benchmark prompts do
not cover.

The default benchmark prompts (:func:`specdecode.demo.demo_prompts`) are windows of
standard-library files starting at a ``def`` / ``class`` line. The sets here are of other kinds,
written for this benchmark: **code** (top-level scripts, tests, command-line tools, data
plumbing, configuration) and **prose** (English paragraphs: documentation, notes, narrative).
Each kind has two disjoint halves:

- ``"tune"``: the prompts builder settings (priors, buckets, re-planning) were tuned on;
- ``"report"``: the prompts results are reported on, never looked at while tuning.

``python -m specdecode bench --trees --prompt-set report`` runs the reporting half (both kinds);
``--prompt-set report-code`` / ``report-prose`` one kind; ``demo`` is the default benchmark set.

>>> sorted(PROMPT_SETS)
['report', 'report-code', 'report-prose', 'tune', 'tune-code', 'tune-prose']
>>> len(PROMPT_SETS["report"]), set(PROMPT_SETS["tune"]).isdisjoint(PROMPT_SETS["report"])
(16, True)

**Chat** requests for chat targets (SmolLM2-135M-Instruct), :data:`CHAT_PROMPT_SETS`, in the same
two halves: ``"tune"`` (16; 4 until 2026-11-28) and ``"report"`` (16). None of them is among the training kit's
default prompts (:mod:`specdecode.training.prompts`), and their subjects are not in its lists.
"""

from __future__ import annotations

__all__ = ["CHAT_PROMPT_SETS", "PROMPT_SETS", "chat_prompt_set", "prompt_set"]

_TUNE_CODE = [
    "import sys\nimport json\n\n\nif __name__ == \"__main__\":\n    path = sys.argv[1]\n    with open(path) as f:\n"
    "        data = json.load(f)\n    for key, value in sorted(data.items()):\n",
    "import unittest\n\n\nclass TestParser(unittest.TestCase):\n    def setUp(self):\n        self.parser = Parser()\n\n"
    "    def test_empty(self):\n        self.assertEqual(self.parser.parse(\"\"), [])\n\n    def test_single(self):\n",
    "import argparse\n\nparser = argparse.ArgumentParser(description=\"Copy files.\")\n"
    "parser.add_argument(\"source\")\nparser.add_argument(\"dest\")\nparser.add_argument(\"--verbose\", "
    "action=\"store_true\")\nargs = parser.parse_args()\n",
    "rows = []\nfor line in open(\"data.csv\"):\n    fields = line.rstrip(\"\\n\").split(\",\")\n    if not fields[0]:\n"
    "        continue\n    rows.append(fields)\n\ntotal = 0\nfor row in rows:\n",
    "DEFAULTS = {\n    \"host\": \"localhost\",\n    \"port\": 8080,\n    \"debug\": False,\n    \"timeout\": 30,\n}\n\n\n"
    "def load_config(path):\n    config = dict(DEFAULTS)\n",
    "import os\n\nfor root, dirs, files in os.walk(\".\"):\n    for name in files:\n        if name.endswith(\".py\"):\n"
    "            full = os.path.join(root, name)\n",
    "try:\n    import numpy as np\nexcept ImportError:\n    np = None\n\n\nif np is not None:\n"
    "    values = np.arange(10)\n",
    "words = {}\nwith open(\"input.txt\") as handle:\n    for line in handle:\n        for word in line.split():\n"
    "            word = word.lower()\n",
]

_REPORT_CODE = [
    "import logging\n\nlogger = logging.getLogger(__name__)\n\n\nif __name__ == \"__main__\":\n"
    "    logging.basicConfig(level=logging.INFO)\n    logger.info(\"starting\")\n    for i in range(3):\n",
    "import unittest\n\n\nclass TestStack(unittest.TestCase):\n    def test_push(self):\n        stack = Stack()\n"
    "        stack.push(1)\n        self.assertEqual(stack.top(), 1)\n\n    def test_pop_empty(self):\n",
    "import sys\n\nif len(sys.argv) < 2:\n    print(\"usage: count.py FILE\", file=sys.stderr)\n    sys.exit(2)\n\n"
    "count = 0\nwith open(sys.argv[1]) as f:\n",
    "results = {}\nfor name in names:\n    try:\n        value = compute(name)\n    except ValueError as exc:\n"
    "        print(\"skipping\", name, exc)\n        continue\n",
    "SETTINGS = [\n    (\"width\", 80),\n    (\"height\", 24),\n    (\"color\", True),\n]\n\nfor key, value in SETTINGS:\n",
    "import re\n\npattern = re.compile(r\"(\\w+)=(\\d+)\")\nfor line in lines:\n    match = pattern.match(line)\n"
    "    if match is None:\n",
    "import time\n\nstart = time.time()\nitems = list(range(1000))\nsquares = [x * x for x in items]\n"
    "elapsed = time.time() - start\n",
    "with open(\"out.txt\", \"w\") as out:\n    for index, item in enumerate(items):\n        if index % 2 == 0:\n",
]

_TUNE_PROSE = [
    "The library reads its configuration from a file in the user's home directory. If the file "
    "does not exist, the default values are used, and a warning is printed once. ",
    "When the function is called with an empty list, it returns None instead of raising an error. "
    "This behaviour is kept for compatibility with older versions of the module, ",
    "The river runs through the middle of the town, and in the summer the children swim near the "
    "old bridge. In the winter the water is cold and ",
    "To install the package, download the archive, unpack it into a new directory, and run the "
    "setup script from that directory. The script will ",
    "This document describes the format of the data files. Each file starts with a header line "
    "that names the columns, followed by one line for each record. ",
    "The meeting was moved to Thursday because the room was not available on Tuesday. Everyone "
    "who planned to attend should ",
    "Errors are reported to the caller as exceptions. The message of each exception names the "
    "argument that was wrong and the value that was expected, so that ",
    "She opened the window and looked out at the garden. The rain had stopped, and the light was "
    "coming back over the hills. ",
]

_REPORT_PROSE = [
    "The server keeps a list of the clients that are connected. When a client sends a message, "
    "the server forwards it to every other client in the list, and ",
    "By default the command prints its output to the screen. Use the option to write the output "
    "to a file instead; the file is created if it does not exist, and ",
    "The first version of the program was written in a single weekend. It was small and slow, but "
    "it worked, and people started to use it. ",
    "Each test creates a temporary directory, writes the input files into it, and runs the tool on "
    "them. When the test ends, the directory is removed, so ",
    "The old house at the end of the street had been empty for years. Nobody knew who owned it, "
    "and the garden was full of ",
    "This section explains how the cache works. When a value is requested for the first time, it "
    "is computed and stored; later requests ",
    "If the connection is lost, the client waits a few seconds and tries again. After five failed "
    "attempts it gives up and reports the error to the user, who ",
    "The results of the survey show that most users prefer the new interface. However, a small "
    "number of them found it harder to ",
]

PROMPT_SETS: dict[str, list[str]] = {
    "tune-code": _TUNE_CODE,
    "tune-prose": _TUNE_PROSE,
    "tune": _TUNE_CODE + _TUNE_PROSE,
    "report-code": _REPORT_CODE,
    "report-prose": _REPORT_PROSE,
    "report": _REPORT_CODE + _REPORT_PROSE,
}


def prompt_set(name: str) -> list[str]:
    """The prompts of set ``name`` (a key of :data:`PROMPT_SETS`), a new list.

    >>> len(prompt_set("tune-code"))
    8
    """
    if name not in PROMPT_SETS:
        raise ValueError(f"name: expected one of {', '.join(sorted(PROMPT_SETS))}, got {name!r}")
    return list(PROMPT_SETS[name])


CHAT_PROMPT_SETS: dict[str, list[str]] = {
    "tune": [
        "Write a short paragraph about why people enjoy gardening.",
        "What are three common mistakes new programmers make?",
        "Explain how a refrigerator keeps food cold.",
        "Give me a simple recipe for pancakes.",
        # 12 more since 2026-11-28 (4 prompts of 64 tokens were too few to choose between close drafters);
        # none is a near-copy of a training-kit prompt (tests/test_training_prompts.py) or of the
        # shipped SmolLM2 prompt file's
        "How does a hot air balloon rise, and how does the pilot steer it?",
        "Write a thank-you note to a neighbor who watered my plants while I was away.",
        "What should I pack for a weekend camping trip in the mountains?",
        "What are some good habits for keeping a tidy kitchen?",
        "Give me three ideas for a rainy afternoon with two young children.",
        "Describe the life cycle of a butterfly.",
        "Explain how a lock and key work.",
        "Write a short poem about an autumn walk through a forest.",
        "How do vaccines teach the body to fight a disease?",
        "Explain how the gears on a bicycle make pedaling easier.",
        "What makes a good first pet for a family with small kids?",
        "Write an email asking my landlord to repair the heating in my apartment.",
    ],
    "report": [
        "What is the difference between a virus and a bacterium?",
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Explain what machine learning is to someone who has never heard of it.",
        "Give me five tips for staying focused while studying.",
        "Why do leaves change color in the fall?",
        "Describe how to change a flat tire on a car.",
        "What are the benefits of drinking water every day?",
        "Write a friendly message inviting my neighbors to a summer barbecue.",
        "What is the difference between a crocodile and an alligator?",
        "Write a short speech for a friend's retirement party.",
        "Explain how a bill becomes a law.",
        "What should I know before adopting a rabbit?",
        "Describe a typical day for a firefighter.",
        "How do submarines dive and come back up?",
        "Suggest a weekly workout plan for a beginner.",
        "Write a short review of an imaginary fantasy novel.",
    ],
}


def chat_prompt_set(name: str) -> list[str]:
    """The chat requests of half ``name`` (``"tune"`` or ``"report"``), a new list.

    >>> len(chat_prompt_set("report"))
    16
    """
    if name not in CHAT_PROMPT_SETS:
        raise ValueError(f"name: expected one of {', '.join(sorted(CHAT_PROMPT_SETS))}, got {name!r}")
    return list(CHAT_PROMPT_SETS[name])


#: **Records**: one structured task over many inputs (the same output format every time, as a
#: batch job that fills one JSON record per person), for chat targets; the tune and report people
#: are disjoint (:func:`record_prompt_set`).
RECORD_TASK = ("Give a JSON object with the keys \"name\", \"born\" (a year), \"country\", \"field\" and "
               "\"known_for\" (one short phrase) for this person: {}. Answer with the JSON only.")
RECORD_PEOPLE: dict[str, list[str]] = {
    "tune": ["Marie Curie", "Isaac Newton", "Ada Lovelace", "Charles Darwin", "Nikola Tesla", "Jane Austen",
             "Ludwig van Beethoven", "Leonardo da Vinci", "Galileo Galilei", "Florence Nightingale",
             "Albert Einstein", "William Shakespeare", "Alan Turing", "Rosalind Franklin", "Louis Pasteur",
             "Johann Sebastian Bach"],
    "report": ["Michael Faraday", "Emily Dickinson", "Gregor Mendel", "Frida Kahlo", "James Clerk Maxwell",
               "Wolfgang Amadeus Mozart", "Dmitri Mendeleev", "Virginia Woolf", "Niels Bohr", "Mark Twain",
               "Grace Hopper", "Claude Monet", "Carl Linnaeus", "Lise Meitner", "Johannes Kepler", "Leo Tolstoy"],
}


def record_prompt_set(name: str) -> list[str]:
    """The record requests of half ``name`` (``"tune"`` or ``"report"``): :data:`RECORD_TASK`
    for each of that half's people, a new list.

    >>> record_prompt_set("report")[0][-60:]
    'for this person: Michael Faraday. Answer with the JSON only.'
    """
    if name not in RECORD_PEOPLE:
        raise ValueError(f"name: expected one of {', '.join(sorted(RECORD_PEOPLE))}, got {name!r}")
    return [RECORD_TASK.format(person) for person in RECORD_PEOPLE[name]]
