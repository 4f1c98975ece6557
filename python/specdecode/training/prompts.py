"""Chat prompts for self-distillation: thousands of distinct requests made from templates.

A drafter trained on a few dozen prompts learns their topics, not the target. This module
combines request templates with subjects (every list written for this kit, nothing
downloaded) into :func:`chat_prompts`: explanations, how-tos, creative writing, lists,
comparisons, code, messages and questions, in a seeded order. The benchmark's chat prompts
(:mod:`specdecode.prompt_sets`) are kept out: their subjects are not in these lists, and
a test checks that no benchmark prompt is among them.
"""

from __future__ import annotations

import itertools

import torch

__all__ = ["chat_prompts", "num_chat_prompts", "topic_lists"]

_CONCEPTS = (
    "a hash table", "photosynthesis", "inflation", "gravity", "the water cycle", "an API", "recursion",
    "compound interest", "black holes", "plate tectonics", "the immune system", "supply and demand",
    "electric circuits", "DNA", "a blockchain", "the greenhouse effect", "opportunity cost", "entropy",
    "a neural network", "the stock market", "democracy", "the Pythagorean theorem", "natural selection",
    "a database index", "the speed of light", "magnetism", "a binary search", "tides", "the printing press",
    "cloud computing", "a credit score", "the placebo effect", "volcanoes", "the moon's phases",
    "encryption", "a compiler", "the Renaissance", "sound waves", "interest rates", "a mortgage",
    "the nitrogen cycle", "jet engines", "the scientific method", "probability", "a sorting algorithm",
    "earthquakes", "solar panels", "the Roman Empire", "weather forecasts", "a version control system",
    "nuclear fusion", "the human heart", "memory in computers", "taxes", "the French Revolution",
    "rainbows", "a search engine", "the Silk Road", "batteries", "caffeine", "sleep cycles",
    "the Big Bang", "coral reefs", "a budget", "the Internet of Things", "hurricanes", "antibiotics",
    "GPS", "the periodic table", "a cell membrane", "economic recessions", "operating systems",
    "the Olympic Games", "bees and pollination", "wind power", "the stomach", "ocean currents",
    "a spreadsheet", "time zones", "fractions", "the electoral college", "glaciers", "deserts",
    "the food chain", "a marathon training plan", "meditation", "a password manager",
)
_TASKS = (
    "bake bread at home", "start a vegetable garden on a balcony", "write a good résumé",
    "prepare for a job interview", "learn a new language quickly", "clean a cast iron pan",
    "set up a home network", "train a puppy to sit", "make cold brew coffee", "plan a birthday party",
    "organize a messy closet", "save for a vacation", "improve my handwriting", "start running",
    "fix a leaking faucet", "write a cover letter", "choose a laptop", "memorize a speech",
    "make friends in a new city", "reduce my screen time", "paint a room", "cook rice on the stove",
    "back up my photos", "negotiate a salary", "take better photos with my phone", "keep a journal",
    "make a paper airplane", "brew green tea", "study for a math exam", "learn to juggle",
    "decorate a small apartment", "care for a houseplant", "write a book review", "plan a road trip",
    "stop procrastinating", "make homemade pizza", "start a podcast", "learn to swim as an adult",
    "set goals for the new year", "teach a child to ride a bike", "read more books", "fold a shirt neatly",
    "calm down before an exam", "write a toast for a wedding", "sort my recycling", "sharpen a kitchen knife",
)
_FORMS = ("a short poem", "a haiku", "a limerick", "a short story", "a diary entry", "a fable",
          "a song verse", "a two-line joke", "a dialogue", "a product description", "a news headline and lead",
          "a motivational speech")
_SUBJECTS = (
    "a robot learning to paint", "the first snow of winter", "a cat who wants to be a pilot", "a busy train station",
    "an old library", "a dragon who is afraid of fire", "a lost umbrella", "the city at dawn", "a small boat in a storm",
    "a friendly ghost", "a forgotten birthday", "a mountain village", "an astronaut's first day on Mars",
    "a talking tree", "a chess tournament", "a bakery at midnight", "a detective who loves tea",
    "a rainy Sunday", "a grandmother's recipe book", "a time traveler in a supermarket", "a lonely satellite",
    "a garden in spring", "a runaway kite", "a penguin in the desert", "the last day of school",
    "a secret tunnel", "a street musician", "a new pair of shoes", "an owl who cannot sleep", "a clock that runs backwards",
)
_LISTS = ("ideas for a weekend with friends", "healthy snacks", "ways to save energy at home", "books for a long flight",
          "questions to ask at a job interview", "habits of productive people", "board games for families",
          "ways to be kinder to yourself", "easy dinners for busy evenings", "reasons to learn to code",
          "things to do in a small town", "tips for a first-time manager", "uses for baking soda",
          "ways to make a small room feel bigger", "hobbies that cost little money", "facts about the ocean",
          "ways to keep a conversation going", "exercises you can do at a desk", "names for a pet turtle",
          "tips for writing clearly")
_PAIRS = (("tea", "coffee"), ("trains", "planes"), ("Python", "JavaScript"), ("renting", "buying a home"),
          ("e-books", "paper books"), ("cities", "the countryside"), ("summer", "winter"), ("running", "swimming"),
          ("a laptop", "a desktop computer"), ("solar power", "wind power"), ("chess", "checkers"),
          ("email", "phone calls"), ("saving", "investing"), ("TCP", "UDP"), ("a novel", "a short story"),
          ("mountains", "beaches for a holiday"), ("SQL", "NoSQL databases"), ("jogging", "walking"),
          ("a tablet", "a phone"), ("working alone", "working in a team"))
_LANGUAGES = ("Python", "JavaScript", "C", "Rust", "Go", "Java")
_FUNCTIONS = ("checks whether a string is a palindrome", "returns the n-th Fibonacci number",
              "counts the vowels in a sentence", "merges two sorted lists", "removes duplicates from a list",
              "finds the largest number in an array", "converts a temperature from Fahrenheit to Celsius",
              "computes the factorial of a number", "checks whether a year is a leap year",
              "reverses a linked list", "counts the words in a text", "sums the digits of an integer",
              "returns the greatest common divisor of two numbers", "capitalizes every word in a string",
              "checks whether two strings are anagrams", "flattens a nested list", "computes the average of a list",
              "finds the second smallest element", "validates an email address roughly",
              "converts a number to Roman numerals")
_MESSAGES = (("a polite email", "my landlord", "a broken heater"), ("a short note", "a new coworker", "welcoming them to the team"),
             ("a friendly text", "an old friend", "meeting for lunch"), ("a formal letter", "my bank", "a wrong charge"),
             ("an apology", "a customer", "a late delivery"), ("a thank-you message", "my mentor", "their advice"),
             ("a reminder", "my book club", "next week's meeting"), ("a cheerful announcement", "my team", "a project launch"),
             ("a request", "my professor", "an extension on an essay"), ("an invitation", "my family", "a holiday dinner"))
_QUESTIONS = (
    "Why do cats purr?", "How far away is the sun?", "Why is the ocean salty?", "How do airplanes stay in the air?",
    "What makes a good leader?", "Why do we dream?", "How are rainbows formed?", "What is the tallest mountain on Earth?",
    "Why do onions make people cry?", "How does a microwave oven heat food?", "What is a leap year?",
    "How do birds know where to migrate?", "Why do we have fingerprints?", "What is the largest animal alive today?",
    "How does soap clean things?", "Why does ice float?", "What is the difference between a lake and a pond?",
    "How do noise-cancelling headphones work?", "Why do stars twinkle?", "How do plants know which way is up?",
    "What is a prime number?", "Why do we yawn?", "How does a compass work?", "What is the internet made of?",
)
_EXPLAIN = ("Explain {} in simple terms.", "What is {}? Give an example.", "Explain {} to a ten-year-old.",
            "Write a short paragraph about {}.", "What are the most important facts about {}?",
            "Describe {} in three sentences.")
_HOW = ("How do I {}?", "Give me a step-by-step guide to {}.", "What are common mistakes when trying to {}?",
        "What do I need to {}?")
_CREATE = ("Write {} about {}.", "Can you write {} about {}?")
_LIST = ("Give me five {}.", "List three {} and explain each briefly.", "What are some {}?")
_COMPARE = ("Compare {} and {}.", "What are the pros and cons of {} versus {}?", "Should I choose {} or {}? Explain.")
_CODE = ("Write a {} function that {}.", "Show me how to write a {} function that {}, with a short explanation.")
_MESSAGE = ("Write {} to {} about {}.", "Help me write {} to {} about {}.")


def _all_prompts() -> list[str]:
    out: list[str] = []
    out += [t.format(c) for t in _EXPLAIN for c in _CONCEPTS]
    out += [t.format(task) for t in _HOW for task in _TASKS]
    out += [t.format(f, s) for t in _CREATE for f, s in itertools.product(_FORMS, _SUBJECTS)]
    out += [t.format(x) for t in _LIST for x in _LISTS]
    out += [t.format(a, b) for t in _COMPARE for a, b in _PAIRS]
    out += [t.format(lang, f) for t in _CODE for lang, f in itertools.product(_LANGUAGES, _FUNCTIONS)]
    out += [t.format(*m) for t in _MESSAGE for m in _MESSAGES]
    out += list(_QUESTIONS)
    return list(dict.fromkeys(out))


def num_chat_prompts() -> int:
    """How many distinct prompts :func:`chat_prompts` draws from."""
    return len(_all_prompts())


def chat_prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` chat requests in a seeded order, each distinct while ``count`` is at most
    :func:`num_chat_prompts` (the list repeats after that)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count: expected an int >= 1, got {count!r}")
    texts = _all_prompts()
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    return [texts[order[i % len(order)]] for i in range(count)]


def topic_lists() -> dict[str, tuple[str, ...]]:
    """The subject lists the templates are filled with (``concepts``, ``tasks``, ``subjects``,
    ``lists``), for other prompt sources (:mod:`specdecode.training.prompt_sources`)."""
    return {"concepts": _CONCEPTS, "tasks": _TASKS, "subjects": _SUBJECTS, "lists": _LISTS}
