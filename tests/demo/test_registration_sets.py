"""The registration's tuning and held-out sets: their manifests hold what the discipline
needs (other people, every class on several people, a reference for each), a bad row is
refused by name, and a row rebuilds the same scan every time.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import pytest

from mriprep.demo import registration_sets as sets

HEADER = "case,class,person,source,acquisition,pose,variations\n"


@pytest.fixture(scope="module")
def rows():
    return {which: sets.read_rows(which) for which in sets.SETS}


def _people_by_class(rows):
    people = defaultdict(set)
    for row in rows:
        people[row.variation].add(row.person.split("@")[0])
    return people


def test_every_class_of_the_held_out_set_is_on_several_people(rows):
    people = _people_by_class(rows["heldout"])
    assert set(people) == set(sets.CLASSES)
    for variation, who in people.items():
        assert len(who) >= 3, (variation, who)


def test_the_held_out_set_has_people_the_tuning_set_never_holds(rows):
    tuning = {r.person.split("@")[0] for r in rows["tuning"]}
    heldout = {r.person.split("@")[0] for r in rows["heldout"]}
    synthetic = {p for p in heldout if p.startswith("person-")}
    assert len(synthetic) >= 3 and not synthetic & tuning
    # The real heads are in both sets, in other combinations: no row is in both.
    assert {"colin27", "s1", "robex"} <= heldout
    assert not {(r.source, r.acquisition, r.pose, r.variations) for r in rows["heldout"]} \
        & {(r.source, r.acquisition, r.pose, r.variations) for r in rows["tuning"]}


def test_the_reported_cases_are_in_the_held_out_set_on_every_real_head():
    found = sets.reported_case_names()
    assert set(found) == set(sets.REPORTED_CASES)
    for label, names in found.items():
        assert {n.split("/")[0] for n in names} == set(sets.REAL_PEOPLE), label
    assert len(found["2x2x3 mm int16, 3 poses"]) == 3 * len(sets.REAL_PEOPLE)


@pytest.mark.parametrize("row, message", [
    ("a/x,posez,a,colin27,1mm,1,", "class 'posez' is not one of"),
    ("a/x,poses,a,colin27,1mx,1,", "acquisition '1mx' is unknown"),
    ("a/x,poses,a,colin28,1mm,1,", "source 'colin28' is neither a real scan"),
    ("a/x,poses,a,colin27,1mm,1,warp", "variation 'warp' is unknown"),
    ("a/x,poses,a,colin27,1mm,1,defects(nan=x)", "could not convert"),
])
def test_a_bad_row_is_refused_naming_the_file_the_case_and_the_value(row, message):
    text = HEADER + "a/ref,reference,a,colin27,1mm,1,\n" + row + "\n"
    with pytest.raises(ValueError, match=message) as caught:
        sets.parse_rows(text, "mine.csv")
    assert "mine.csv, case 'a/x'" in str(caught.value)


def test_a_person_without_a_reference_row_is_refused():
    with pytest.raises(ValueError, match="person 'b' has no reference row"):
        sets.parse_rows(HEADER + "a/ref,reference,a,colin27,1mm,1,\n"
                        "b/x,poses,b,colin27,1mm,2,\n", "mine.csv")


def test_variations_parse_with_their_arguments():
    assert sets._parsed_variations("defaced+defects(nan=3,zero=2)+int16(bits=8)") == [
        ("defaced", {}), ("defects", {"nan": 3, "zero": 2}), ("int16", {"bits": 8})]


def test_a_row_rebuilds_the_same_scan_and_another_noise_changes_only_the_noise():
    row = sets.SetRow("person-80001/x", "defects", "person-80001", "person-80001",
                      "sag3x3x3", "12 0 0 0 8 0", "defects(nan=1,zero=2)")
    first, again = sets.build_scan(row), sets.build_scan(row)
    np.testing.assert_array_equal(first.data, again.data)
    other = sets.build_scan(row, noise=1)
    np.testing.assert_array_equal(other.pose, first.pose)
    broken = ~np.isfinite(first.data) | (first.data == 0)
    np.testing.assert_array_equal(~np.isfinite(other.data) | (other.data == 0), broken)
    assert not np.allclose(np.nan_to_num(other.data), np.nan_to_num(first.data))
    # The explicit pose is what the row says: 12 degrees about x, 8 mm along y.
    np.testing.assert_allclose(first.pose[1, 3], 8.0)
    bare = sets.build_scan(dataclasses.replace(row, variations=""))
    assert np.isfinite(bare.data).all()
