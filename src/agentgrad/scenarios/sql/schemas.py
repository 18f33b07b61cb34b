"""The SQL world's schemas: tables, columns, foreign keys and the pools their rows are drawn from.

A schema is data, not code, so the question templates (``questions.py``) work on every schema
through what each column *is* — a row's label, a category, a number, a reference to another
table — and a new schema is a new entry in :data:`SCHEMAS`. Every table and column has a few
SQL names to choose from: each generated database picks its own (``customers`` here, ``clients``
there), so two databases of one schema differ in their names as well as in their rows, and an
agent has to read the schema it is given rather than memorise one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ColumnKind = Literal["label", "category", "number", "ref"]


@dataclass(frozen=True)
class Column:
    """One column besides the ``id`` primary key every table has."""

    #: What the column is: ``label`` names a row (unique within its table), ``category`` is a
    #: value from ``values``, ``number`` an integer in ``[low, high]``, ``ref`` a foreign key to
    #: the table ``ref``.
    kind: ColumnKind
    #: SQL names a database may give the column (the first is the usual one).
    names: tuple[str, ...]
    #: How a question says it: "city", "price".
    noun: str
    values: tuple[str, ...] = ()
    low: int = 0
    high: int = 0
    ref: str = ""
    #: Share of rows whose value is NULL (never for labels and references).
    null_rate: float = 0.0


@dataclass(frozen=True)
class Table:
    """A table: its SQL names, how a question names its rows, its columns and its size."""

    key: str
    names: tuple[str, ...]
    singular: str
    plural: str
    columns: tuple[Column, ...]
    rows: tuple[int, int] = (8, 16)


@dataclass(frozen=True)
class Schema:
    """A database design: its tables, parents before the tables that refer to them."""

    name: str
    tables: tuple[Table, ...] = field(default_factory=tuple)

    def table(self, key: str) -> Table:
        return next(t for t in self.tables if t.key == key)


_FIRST = (
    "Ada",
    "Ben",
    "Cara",
    "Dan",
    "Eva",
    "Finn",
    "Gia",
    "Hugo",
    "Iris",
    "Jon",
    "Kai",
    "Lea",
    "Max",
    "Nia",
    "Omar",
    "Pia",
    "Quin",
    "Rosa",
    "Sam",
    "Tara",
    "Uma",
    "Vic",
    "Wes",
    "Yara",
    "Zoe",
)
_LAST = (
    "Abe",
    "Bell",
    "Cruz",
    "Dale",
    "Ellis",
    "Frost",
    "Gray",
    "Hale",
    "Ives",
    "Jett",
    "Knox",
    "Lowe",
    "Moss",
    "Nash",
    "Ortiz",
    "Park",
    "Reed",
    "Shaw",
    "Todd",
    "Vance",
    "West",
    "York",
)
#: Full names: enough for the largest table without repeating one.
PEOPLE = tuple(f"{first} {last}" for last in _LAST for first in _FIRST)
CITIES = (
    "Avon",
    "Bergen",
    "Cadiz",
    "Delft",
    "Essen",
    "Faro",
    "Genoa",
    "Hilo",
    "Izmir",
    "Jena",
    "Kobe",
    "Lagos",
    "Malmo",
    "Nantes",
    "Oslo",
    "Porto",
    "Quito",
    "Riga",
    "Split",
    "Turku",
)
COUNTRIES = ("Norway", "Chile", "Japan", "Kenya", "Peru", "Spain", "Italy", "Ghana", "Nepal", "Wales")
_ADJ = (
    "Red",
    "Blue",
    "Green",
    "Silver",
    "Golden",
    "Quiet",
    "Bright",
    "Swift",
    "Tiny",
    "Grand",
    "Wild",
    "Lucky",
    "Brave",
    "Calm",
    "Bold",
    "Dark",
)
_THING = (
    "Lamp",
    "Chair",
    "Kettle",
    "Clock",
    "Mug",
    "Desk",
    "Fan",
    "Rug",
    "Vase",
    "Bowl",
    "Pen",
    "Bag",
    "Shelf",
    "Tray",
)
PRODUCTS = tuple(f"{a} {t}" for t in _THING for a in _ADJ)
_TOPIC = (
    "Algebra",
    "Biology",
    "Chemistry",
    "Drawing",
    "Economics",
    "French",
    "Geology",
    "History",
    "Latin",
    "Music",
    "Physics",
    "Poetry",
    "Statistics",
    "Zoology",
)
COURSES = tuple(f"{topic} {level}" for level in ("I", "II", "III") for topic in _TOPIC)
_NOUN = (
    "River",
    "Garden",
    "Winter",
    "Mirror",
    "Harbor",
    "Forest",
    "Letter",
    "Island",
    "Shadow",
    "Engine",
    "Lantern",
    "Meadow",
    "Tower",
    "Voyage",
)
TITLES = tuple(f"The {a} {n}" for n in _NOUN for a in _ADJ)
AIRLINES = tuple(f"{a} {w}" for w in ("Air", "Wings", "Jet", "Skies") for a in _ADJ)
BANDS = tuple(f"The {a} {n}s" for n in _NOUN for a in _ADJ)

SCHEMAS: tuple[Schema, ...] = (
    Schema(
        "shop",
        (
            Table(
                "customer",
                ("customers", "clients", "buyers"),
                "customer",
                "customers",
                (
                    Column("label", ("name", "full_name"), "name", values=PEOPLE),
                    Column("category", ("city", "home_city"), "city", values=CITIES[:8]),
                    Column("number", ("age", "years"), "age", low=18, high=80, null_rate=0.15),
                ),
            ),
            Table(
                "product",
                ("products", "items", "goods"),
                "product",
                "products",
                (
                    Column("label", ("name", "title"), "name", values=PRODUCTS),
                    Column(
                        "category",
                        ("category", "kind"),
                        "category",
                        values=("kitchen", "office", "garden", "toys", "decor"),
                    ),
                    Column("number", ("price", "cost"), "price", low=2, high=300),
                ),
            ),
            Table(
                "order",
                ("orders", "purchases", "sales"),
                "order",
                "orders",
                (
                    Column("ref", ("customer_id", "buyer_id"), "customer", ref="customer"),
                    Column("ref", ("product_id", "item_id"), "product", ref="product"),
                    Column("number", ("quantity", "amount"), "quantity", low=1, high=9),
                ),
                rows=(14, 24),
            ),
        ),
    ),
    Schema(
        "school",
        (
            Table(
                "teacher",
                ("teachers", "instructors", "staff"),
                "teacher",
                "teachers",
                (
                    Column("label", ("name", "full_name"), "name", values=PEOPLE),
                    Column(
                        "category",
                        ("subject", "department"),
                        "subject",
                        values=("math", "science", "arts", "languages", "sport"),
                    ),
                    Column("number", ("salary", "pay"), "salary", low=2000, high=6000, null_rate=0.1),
                ),
                rows=(6, 10),
            ),
            Table(
                "course",
                ("courses", "classes", "modules"),
                "course",
                "courses",
                (
                    Column("label", ("title", "name"), "title", values=COURSES),
                    Column("ref", ("teacher_id", "instructor_id"), "teacher", ref="teacher"),
                    Column("number", ("credits", "points"), "credits", low=1, high=8),
                ),
            ),
            Table(
                "student",
                ("students", "pupils", "learners"),
                "student",
                "students",
                (
                    Column("label", ("name", "full_name"), "name", values=PEOPLE),
                    Column("category", ("city", "hometown"), "city", values=CITIES[6:14]),
                    Column("number", ("year", "grade"), "year", low=1, high=6),
                ),
                rows=(10, 18),
            ),
            Table(
                "enrollment",
                ("enrollments", "registrations", "signups"),
                "enrollment",
                "enrollments",
                (
                    Column("ref", ("student_id", "pupil_id"), "student", ref="student"),
                    Column("ref", ("course_id", "class_id"), "course", ref="course"),
                    Column("number", ("score", "mark"), "score", low=30, high=100, null_rate=0.1),
                ),
                rows=(16, 26),
            ),
        ),
    ),
    Schema(
        "flights",
        (
            Table(
                "airline",
                ("airlines", "carriers"),
                "airline",
                "airlines",
                (
                    Column("label", ("name", "carrier_name"), "name", values=AIRLINES),
                    Column("category", ("country", "home_country"), "country", values=COUNTRIES),
                    Column("number", ("fleet_size", "planes"), "fleet size", low=5, high=400),
                ),
                rows=(5, 9),
            ),
            Table(
                "airport",
                ("airports", "terminals"),
                "airport",
                "airports",
                (
                    Column("label", ("city", "city_name"), "city", values=CITIES),
                    Column("category", ("country", "nation"), "country", values=COUNTRIES),
                    Column("number", ("gates", "gate_count"), "number of gates", low=2, high=120),
                ),
                rows=(6, 12),
            ),
            Table(
                "flight",
                ("flights", "routes"),
                "flight",
                "flights",
                (
                    Column(
                        "label",
                        ("code", "flight_number"),
                        "flight number",
                        values=tuple(f"F{n}" for n in range(100, 400, 3)),
                    ),
                    Column("ref", ("airline_id", "carrier_id"), "airline", ref="airline"),
                    Column("ref", ("airport_id", "origin_id"), "airport", ref="airport"),
                    Column("number", ("duration", "minutes"), "duration", low=40, high=720),
                    Column("number", ("price", "fare"), "price", low=50, high=900, null_rate=0.1),
                ),
                rows=(14, 24),
            ),
        ),
    ),
    Schema(
        "library",
        (
            Table(
                "author",
                ("authors", "writers"),
                "author",
                "authors",
                (
                    Column("label", ("name", "full_name"), "name", values=PEOPLE),
                    Column("category", ("country", "nationality"), "country", values=COUNTRIES),
                    Column("number", ("birth_year", "born"), "birth year", low=1900, high=2000, null_rate=0.1),
                ),
                rows=(6, 12),
            ),
            Table(
                "book",
                ("books", "titles", "volumes"),
                "book",
                "books",
                (
                    Column("label", ("title", "name"), "title", values=TITLES),
                    Column("ref", ("author_id", "writer_id"), "author", ref="author"),
                    Column(
                        "category",
                        ("genre", "kind"),
                        "genre",
                        values=("mystery", "fantasy", "poetry", "history", "science"),
                    ),
                    Column("number", ("pages", "page_count"), "number of pages", low=80, high=900),
                ),
                rows=(12, 22),
            ),
        ),
    ),
    Schema(
        "music",
        (
            Table(
                "artist",
                ("artists", "bands", "performers"),
                "artist",
                "artists",
                (
                    Column("label", ("name", "band_name"), "name", values=BANDS),
                    Column("category", ("country", "origin"), "country", values=COUNTRIES),
                ),
                rows=(6, 11),
            ),
            Table(
                "album",
                ("albums", "records"),
                "album",
                "albums",
                (
                    Column("label", ("title", "name"), "title", values=TITLES),
                    Column("ref", ("artist_id", "band_id"), "artist", ref="artist"),
                    Column("category", ("genre", "style"), "genre", values=("rock", "jazz", "folk", "pop", "blues")),
                    Column("number", ("year", "release_year"), "release year", low=1960, high=2024),
                    Column("number", ("sales", "copies_sold"), "sales", low=1000, high=90000, null_rate=0.1),
                ),
                rows=(12, 22),
            ),
        ),
    ),
)

SCHEMA_NAMES: tuple[str, ...] = tuple(s.name for s in SCHEMAS)
