"""Fence records that cannot be used, and why: the preload library refuses each with one line
(tests/integration/test_fence_record.py) and Python's parser with the same reason
(tests/unit/test_fence_render.py). LEDGERS stands for a ledger directory that exists."""

GOOD = "cudatrace-fence 1\ngroup=g\nbudget=1073741824\nledger-dir=LEDGERS\n"
MALFORMED = {
    "not a record": ("hello\n", "line 1: 'hello' is not 'cudatrace-fence 1'"),
    "another version": ("cudatrace-fence 2\n", "is a version this preload library does not"),
    "unknown key": (GOOD + "budgett=1\n", "line 5: 'budgett' is no key of a fence record"),
    "twice": (GOOD + "group=h\n", "line 5: 'group' is given twice"),
    "empty value": (GOOD + "share-label=\n", "line 5: 'share-label' has no value"),
    "control character": (GOOD + "owner=a\tb\n", "line 5: 'owner' holds a control character"),
    "no budget": ("cudatrace-fence 1\ngroup=g\nledger-dir=/x\n", "has no budget"),
    "group and ledger": (GOOD + "ledger=/x/l.ledger\n", "names neither a group nor a ledger"),
    "no ledger-dir": ("cudatrace-fence 1\ngroup=g\nbudget=1GiB\n", "without its ledger-dir"),
    "share alone": (GOOD + "share=41\n", "gives share and share-budget apart"),
    "cut short": (GOOD + "owner=x", "is cut short"),
    "empty": ("", "is empty"),
    "too long": (GOOD + "#" + "x" * 5000 + "\n", "is longer than 4096 bytes"),
    "bad budget": (
        GOOD.replace("1073741824", "lots"),
        "line 3: budget='lots' is not a budget in bytes",
    ),
    "bad on-exceed": (GOOD + "on-exceed=bogus\n", "on-exceed='bogus' is not fail, warn or abort"),
    "bad uid": (GOOD + "uid=alice\n", "uid='alice' is not a uid"),
    "bad group": (GOOD.replace("group=g", "group=.x"), "group='.x' is not a group name"),
    "long group": (
        GOOD.replace("group=g", "group=" + "g" * 900),
        "...' (900 bytes) is not a group",
    ),
    "relative dir": (
        GOOD.replace("LEDGERS", "ledgers"),
        "ledger-dir='ledgers' is not an absolute path",
    ),
    "NUL": (GOOD + "owner=a\0b\n", "holds a NUL byte"),
}
