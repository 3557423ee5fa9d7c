"""The suite's own schedule (tests/conftest.py): the files it names first must exist, or a renamed
long file would silently fall back to its place in the collection and end the run alone."""

from pathlib import Path

from tests.conftest import LONGEST_FILES, TRAINED_GROUP

TESTS = Path(__file__).parent


def test_every_file_the_schedule_names_exists():
    assert all((TESTS / path).is_file() for path in LONGEST_FILES), LONGEST_FILES
    assert all(len(list(TESTS.rglob(name))) == 1 for name in TRAINED_GROUP), TRAINED_GROUP
