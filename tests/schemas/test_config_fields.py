"""Config fields carry their default, help and rules; the CLI, validation and JSON derive from them."""

import argparse
import json
from dataclasses import asdict, dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import config_fields as cf
from schemas.errors import MmlinksError


@dataclass
class Toy:
    name: str = cf.option(help="a name")
    size: int = cf.option(3, help="how big", check=lambda v: v >= 1, rule=">= 1")
    mode: str = cf.option("a", help="which mode", choices=("a", "b"))
    threshold: int | str = cf.option(
        2, help="bits or off", parse=cf.int_or_off(0, 8), check=cf.is_int_or_off(0, 8), rule="0 to 8 or 'off'"
    )
    fast: bool = cf.option(False, help="go fast", flag="--quick")
    hidden: float = cf.option(0.5, help="not on the CLI", flag="")
    token: str = cf.option("", help="a secret", secret=True)

    def __post_init__(self):
        cf.validate(self, "toy")


@dataclass
class Bounded:
    count: int = cf.option(1, help="at least one", at_least=1)
    share: float = cf.option(0.5, help="a share", within=(0, 1))

    def __post_init__(self):
        cf.validate(self, "bounded")


def test_at_least_and_within_are_a_check_and_its_rule_said_once():
    infos = {name: info for name, (_, info) in cf.options_of(Bounded).items()}
    assert (infos["count"].rule, infos["share"].rule) == (">= 1", "in [0, 1]")
    assert Bounded(count=3, share=1.0) == Bounded(3, 1.0)
    with pytest.raises(MmlinksError) as err:
        Bounded(count=0, share=1.5)
    assert "count 0 (>= 1)" in str(err.value) and "share 1.5 (in [0, 1])" in str(err.value)


def parser(**defaults) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    cf.add_arguments(p, Toy, defaults=defaults)
    return p


def test_flags_come_from_fields_with_their_defaults_in_the_help():
    p = parser()
    text = p.format_help()
    assert "how big (default: 3)" in text and "--quick" in text and "--hidden" not in text
    args = p.parse_args(["--name", "x", "--size", "5", "--threshold", "off", "--quick"])
    toy = cf.from_args(Toy, args)
    assert toy == Toy(name="x", size=5, threshold="off", fast=True)
    assert cf.from_args(Toy, p.parse_args(["--name", "y"])) == Toy(name="y")  # absent: the field's default


def test_a_commands_own_defaults_apply_and_show():
    p = parser(size=7)
    assert "(default: 7)" in p.format_help()
    assert cf.from_args(Toy, p.parse_args(["--name", "z"])).size == 7


def test_every_bad_field_is_named_in_one_line():
    with pytest.raises(MmlinksError) as err:
        Toy(name="x", size=0, mode="c", threshold=9)
    text = str(err.value)
    assert "\n" not in text and text.startswith("invalid toy: ")
    assert (
        "size 0 (>= 1)" in text
        and "mode 'c' (one of a, b)" in text
        and "threshold 9 (0 to 8 or 'off')" in text
    )


def test_parse_errors_reach_argparse_as_its_own_error():
    with pytest.raises(SystemExit):
        parser().parse_args(["--name", "x", "--threshold", "three"])
    with pytest.raises(SystemExit):  # a required field (no default) is a required flag
        parser().parse_args([])


def test_json_round_trip_refuses_unknown_keys_and_hides_secrets():
    toy = Toy(name="x", token="s3cret")
    assert cf.from_dict(Toy, json.loads(json.dumps(asdict(toy)))) == toy
    with pytest.raises(MmlinksError, match="unknown Toy field"):
        cf.from_dict(Toy, {"name": "x", "sise": 3})
    assert "token" not in cf.public_dict(toy)


@given(st.integers(min_value=-50, max_value=50))
def test_int_or_off_accepts_exactly_the_range(value):
    parse = cf.int_or_off(0, 16)
    if 0 <= value <= 16:
        assert parse(str(value)) == value and cf.is_int_or_off(0, 16)(value)
    else:
        with pytest.raises(MmlinksError, match="'off'"):
            parse(str(value))
        assert not cf.is_int_or_off(0, 16)(value)


@given(st.sampled_from(["off", "OFF", " Off "]))
def test_off_is_its_own_value(text):
    assert cf.int_or_off(0, 16)(text) == cf.OFF
    assert not cf.is_int_or_off(0, 16)(None)  # None is not off
