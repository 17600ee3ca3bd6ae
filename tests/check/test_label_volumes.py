"""``label-volume`` and ``label-structure-missing`` on made-up cohorts of class volumes:
the robust z in log share, its spread floors, the missing rule and the cohort minimum."""

from __future__ import annotations

import numpy as np

from mriprep.check.label_volumes import (
    MIN_OTHERS,
    MISSING_MIN_MM3,
    judge_volumes,
    listed,
    spread_floor,
)

NAMES = ("Background", "Left-Hippocampus", "Left-Lateral-Ventricle", "ctx-lh-cuneus",
         "Left-Cerebellum-Cortex", "Left-vessel", "Left-Cerebral-White-Matter")
# mm^3 of a typical adult: hippocampus, ventricle, a parcel, cerebellar cortex, vessels,
# and the rest of the brain as one class
TYPICAL = np.array([0.0, 4000.0, 9000.0, 3000.0, 50000.0, 20.0, 1_000_000.0])


def _cohort(n=8, spread=0.03, seed=0, ventricle_spread=0.5):
    rng = np.random.default_rng(seed)
    maps = {}
    for i in range(n):
        head = rng.uniform(0.85, 1.15)  # a bigger head is not a bigger hippocampus
        noise = rng.normal(0.0, spread, TYPICAL.size)
        noise[2] = rng.normal(0.0, ventricle_spread)
        maps[f"m{i}"] = TYPICAL * head * np.exp(noise)
    return maps


def test_clean_cohort_of_different_head_sizes_flags_nothing():
    judged = judge_volumes(_cohort(), NAMES)
    assert judged.judged and judged.maps == 8
    assert not any(judged.flags.values()) and not any(judged.missing.values())


def test_a_structure_at_twice_its_volume_is_named_with_its_ratio():
    maps = _cohort()
    maps["m3"] = maps["m3"].copy()
    maps["m3"][1] *= 2.0
    judged = judge_volumes(maps, NAMES)
    (flag,) = judged.flags["m3"]
    assert flag.structure == "Left-Hippocampus" and 1.8 < flag.ratio < 2.2 and flag.z > 3.5
    assert "Left-Hippocampus" in listed(judged.flags["m3"])
    assert not any(v for k, v in judged.flags.items() if k != "m3")


def test_the_spread_floor_keeps_a_uniform_cohort_from_flagging_a_small_difference():
    maps = {f"m{i}": TYPICAL.copy() for i in range(6)}  # one template, copied
    maps["m0"] = TYPICAL * np.array([1, 1.2, 1, 1, 1, 1, 1])  # 20%: within the floor
    assert not judge_volumes(maps, NAMES).flags["m0"]
    maps["m0"] = TYPICAL * np.array([1, 1.6, 1, 1.6, 1, 1, 1])
    flagged = {f.structure for f in judge_volumes(maps, NAMES).flags["m0"]}
    # the hippocampus at 1.6x is out; a cortical parcel's borders vary more (its floor)
    assert flagged == {"Left-Hippocampus"}
    assert spread_floor("ctx-lh-cuneus") > spread_floor("Left-Hippocampus")


def test_structures_that_vary_widely_are_judged_on_their_own_spread():
    maps = _cohort(n=12, ventricle_spread=0.5, seed=3)
    maps["m1"] = maps["m1"].copy()
    maps["m1"][2] = np.median([m[2] for m in maps.values()]) * 2.0  # ventricles x2
    assert not judge_volumes(maps, NAMES).flags["m1"]


def test_a_missing_structure_is_named_and_small_or_rare_ones_are_not_expected():
    maps = _cohort()
    maps["m5"] = maps["m5"].copy()
    maps["m5"][4] = 0.0   # no cerebellum
    maps["m5"][5] = 0.0   # no vessels: too small to expect
    judged = judge_volumes(maps, NAMES)
    (missing,) = judged.missing["m5"]
    assert missing.structure == "Left-Cerebellum-Cortex" and missing.present_in == 7
    assert missing.median_mm3 > MISSING_MIN_MM3
    assert not judged.flags["m5"]  # a missing structure is not a volume outlier too
    rare = _cohort()
    for key in ("m0", "m1", "m2"):  # absent from 3 of 8 maps: not what the cohort holds
        rare[key] = rare[key].copy()
        rare[key][4] = 0.0
    assert not any(judge_volumes(rare, NAMES).missing.values())


def test_too_few_maps_are_not_judged_and_say_so():
    maps = dict(list(_cohort().items())[:MIN_OTHERS])  # each against one fewer
    maps["m0"] = maps["m0"] * np.array([1, 3, 1, 1, 0, 1, 1])
    judged = judge_volumes(maps, NAMES)
    assert not judged.judged and not any(judged.flags.values())
    assert judged.summary()["judged"] is False and judged.summary()["maps"] == MIN_OTHERS


def test_an_empty_map_does_not_break_the_others():
    maps = _cohort(ventricle_spread=0.05)
    maps["m2"] = np.zeros_like(TYPICAL)
    judged = judge_volumes(maps, NAMES)
    assert {m.structure for m in judged.missing["m2"]} == {
        "Left-Hippocampus", "Left-Lateral-Ventricle", "ctx-lh-cuneus",
        "Left-Cerebellum-Cortex", "Left-Cerebral-White-Matter"}
    assert not any(v for k, v in judged.flags.items() if k != "m2")


def test_a_large_cohort_is_judged_against_itself_as_a_small_one_against_the_others():
    maps = _cohort(n=150, seed=4, ventricle_spread=0.05)
    maps["m7"] = maps["m7"] * np.array([1, 2.0, 1, 1, 1, 1, 1])
    judged = judge_volumes(maps, NAMES)
    assert [f.structure for f in judged.flags["m7"]] == ["Left-Hippocampus"]
    assert sum(bool(f) for f in judged.flags.values()) == 1
