"""Tests of mriprep.splits.identity: one person's anatomy under two ids or in two splits.

On the demo cache (synthetic people through ``t1w_mni_rigid``, one of them scanned twice
in another pose and grid) and on the real Colin27 scans and the INIA19 macaque placed on
the MNI grid by their own headers (Colin27 is in MNI space; the macaque, scaled to human
size, in its centre), fingerprinted by the check's own tensor pass.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy import ndimage

from mriprep import check as chk
from mriprep.cache import Cache
from mriprep.check.tensors import scan_tensor_file
from mriprep.demo.real_scans import HOW_TO_GET, real_scan
from mriprep.inputs.templates import load_template
from mriprep.splits import IDENTITY_ERROR, IDENTITY_WARNING, find_identity_matches
from mriprep.splits.identity import identity_descriptor
from tests.built_once import built_once
from tests.cache_clone import clone_cache, relabel_entry
from tests.stages.conftest import TEST_PERSON

IDENTITY_CODES = {"identity-leak", "possible-identity-leak", "near-duplicate"}


def scan_names(cache: Cache) -> dict[str, str]:
    return {(f"{e.subject_id}_{e.session_id}" if e.session_id else e.subject_id): e.key
            for e in cache.entries()}


def leak_and_rescan(demo_cohort) -> tuple[str, str]:
    """(the planted copy, the rescan of its original) among the demo's scan names."""
    subjects = demo_cohort.subjects.items()
    copy = next(s for s, t in subjects if any(d["kind"] == "leak" for d in t["defects"]))
    rescan = next(s for s, t in subjects if any(d["kind"] == "rescan" for d in t["defects"]))
    return copy, rescan


@pytest.fixture(scope="module")
def demo_prints(demo_cache) -> dict[str, np.ndarray]:
    """Scan name -> identity fingerprint of every demo cache entry."""
    cache = Cache(demo_cache.path)
    return {name: scan_tensor_file(cache.tensor_path(key, "image"), "image").fingerprint
            for name, key in scan_names(cache).items()}


def relabelled(demo_cache, demo_cohort, tmp_path, split: str) -> tuple[Cache, str]:
    """A clone of the demo cache without the planted copy, where the rescan of sub-01 is
    subject sub-99 in ``split``."""
    copy, rescan = leak_and_rescan(demo_cohort)
    cache = clone_cache(demo_cache.path, tmp_path / "cache", drop_subjects=[copy])
    relabel_entry(cache, scan_names(cache)[rescan], "sub-99", "", split)
    return cache, demo_cohort.subjects[rescan]["split"]


@pytest.mark.slow
def test_rescan_under_another_id_in_another_split_is_an_identity_leak(
        demo_cache, demo_cohort, tmp_path):
    cache, original_split = relabelled(demo_cache, demo_cohort, tmp_path, "val")
    report = chk.check_cache(cache.root)
    [leak] = [f for f in report.findings if f.code in IDENTITY_CODES]
    assert leak.code == "identity-leak" and leak in report.errors
    assert set(leak.subjects) == {"sub-01", "sub-99"}
    for words in ("sub-01", f"({original_split})", "sub-99", "(val)", "same person",
                  "mriprep splits --assign"):
        assert words in leak.message


@pytest.mark.slow
def test_rescan_under_another_id_in_the_same_split_is_a_warning(
        demo_cache, demo_cohort, tmp_path):
    _, rescan = leak_and_rescan(demo_cohort)
    cache, _ = relabelled(demo_cache, demo_cohort, tmp_path,
                          demo_cohort.subjects[rescan]["split"])
    report = chk.check_cache(cache.root)
    [twin] = [f for f in report.findings if f.code in IDENTITY_CODES]
    assert twin.code == "near-duplicate" and twin in report.warnings
    assert set(twin.subjects) == {"sub-01", "sub-99"} and "merge the ids" in twin.message


@pytest.mark.slow
def test_demo_people_are_not_paired_and_the_rescan_is(demo_prints, demo_cohort):
    names = sorted(demo_prints)
    pairs = find_identity_matches(np.stack([demo_prints[n] for n in names]))
    copy, rescan = leak_and_rescan(demo_cohort)
    original = rescan.split("_")[0]
    found = {frozenset((names[i], names[j])): c for i, j, c in pairs}
    # one person, three entries (the first scan, its copy, its rescan), and nobody else
    assert set(found) == {frozenset(p) for p in
                          ((original, copy), (original, rescan), (copy, rescan))}
    assert min(found.values()) >= IDENTITY_ERROR


def on_template_grid(data: np.ndarray, affine: np.ndarray, template) -> np.ndarray:
    """``data`` resampled onto the template grid by its header, z-scored in the head."""
    voxels = np.linalg.inv(affine) @ template.affine
    out = ndimage.affine_transform(data.astype(np.float32), voxels[:3, :3], voxels[:3, 3],
                                   output_shape=template.shape, order=1)
    head = out > 0.1 * np.percentile(out, 99)
    return ((out - out[head].mean()) / out[head].std()).astype(np.float32)


def thick_noisy(data: np.ndarray, rng) -> np.ndarray:
    """Colin27 as a 5 mm axial acquisition with visible noise, back on its 1 mm grid."""
    n = data.shape[2] // 5 * 5
    slabs = data[:, :, :n].reshape(*data.shape[:2], n // 5, 5).mean(axis=3)
    thick = ndimage.zoom(slabs, (1, 1, 5), order=1)
    return thick + 0.05 * float(np.percentile(data, 99)) * rng.standard_normal(thick.shape)


@pytest.fixture(scope="module")
def colin_prints(tmp_path_factory) -> dict[str, np.ndarray]:
    """Identity fingerprints of Colin27 (1 mm, 5 mm noisy, skull-stripped, 0.5 mm) on the
    MNI grid by their headers (Colin27 is in MNI space): no registration run. Built once
    per test run."""
    import nibabel as nib

    if real_scan("colin27") is None:
        pytest.skip(f"the real scans are not installed: {HOW_TO_GET}")

    def build(folder):
        template = load_template("mni152")
        prints = {}
        for name in ("colin27", "colin27_brain", "colin27_05mm", "colin27_5mm_noisy"):
            img = nib.as_closest_canonical(
                nib.load(str(real_scan(name.replace("_5mm_noisy", "")))))
            data = np.asarray(img.dataobj, dtype=np.float32)
            if name.endswith("noisy"):
                data = thick_noisy(data, np.random.default_rng(0))
            np.save(folder / f"{name}.npy", on_template_grid(data, img.affine, template))
            prints[name] = scan_tensor_file(folder / f"{name}.npy", "image").fingerprint
        return prints

    return built_once(tmp_path_factory, "identity_colin_prints", build)


@pytest.fixture(scope="module")
def real_prints(colin_prints, tmp_path_factory) -> dict[str, np.ndarray]:
    """Identity fingerprints of Colin27 (1 mm, 5 mm noisy, skull-stripped, 0.5 mm:
    :func:`colin_prints`) and of the macaque (x2.3) on the MNI grid."""
    import nibabel as nib

    def build(folder):
        template = load_template("mni152")
        img = nib.as_closest_canonical(nib.load(str(real_scan("macaque"))))
        monkey, affine = np.asarray(img.dataobj, dtype=np.float32), img.affine
        scaled = affine.copy()
        scaled[:3] *= 2.3
        centre = scaled[:3, :3] @ (np.array(monkey.shape) / 2) + scaled[:3, 3]
        scaled[:3, 3] -= centre - template.affine[:3, :3] @ (np.array(template.shape) / 2) \
            - template.affine[:3, 3]
        np.save(folder / "macaque_x2.3.npy", on_template_grid(monkey, scaled, template))
        return scan_tensor_file(folder / "macaque_x2.3.npy", "image").fingerprint

    return {**colin_prints,
            "macaque_x2.3": built_once(tmp_path_factory, "identity_macaque_print", build)}


@pytest.mark.slow
def test_colin27_rescans_pair_and_the_macaque_does_not(real_prints, demo_prints, demo_cohort):
    copy, rescan = leak_and_rescan(demo_cohort)
    cohort = {k: v for k, v in demo_prints.items() if k not in (copy, rescan)}
    prints = {**cohort, **real_prints}
    names = sorted(prints)
    pairs = find_identity_matches(np.stack([prints[n] for n in names]))
    found = {frozenset((names[i], names[j])): c for i, j, c in pairs}
    colin = [n for n in names if n.startswith("colin27")]
    expected = {frozenset((a, b)) for a in colin for b in colin if a < b}
    assert set(found) == expected  # no demo person, no macaque
    assert min(found.values()) >= IDENTITY_ERROR


@pytest.mark.slow
def test_one_corrupt_voxel_pairs_nobody(demo_cache, demo_prints, demo_cohort, tmp_path):
    """A voxel of 1e5 moves one block of the descriptor by at most its clip: the
    fingerprint stays its image's, and no new pair appears."""
    cache = Cache(demo_cache.path)
    image = np.asarray(cache.load_tensor(scan_names(cache)["sub-03"], "image"),
                       dtype=np.float32)
    image[98, 116, 94] = 1e5
    np.save(tmp_path / "corrupt.npy", image)
    corrupt = scan_tensor_file(tmp_path / "corrupt.npy", "image").fingerprint
    copy, rescan = leak_and_rescan(demo_cohort)
    names = sorted(n for n in demo_prints if n not in (copy, rescan))
    clean = np.stack([demo_prints[n] for n in names])
    assert find_identity_matches(clean) == []
    dirty = clean.copy()
    dirty[names.index("sub-03")] = corrupt
    assert find_identity_matches(dirty) == []
    assert np.corrcoef(corrupt, demo_prints["sub-03"])[0, 1] > 0.99  # 0.996 measured


def test_descriptor_ignores_contrast_scaling_and_a_constant_image_has_none():
    rng = np.random.default_rng(0)
    blocks = ndimage.gaussian_filter(rng.standard_normal((32, 32, 32)), 2)
    assert np.allclose(identity_descriptor(blocks), identity_descriptor(3.0 * blocks + 7.0),
                       atol=1e-5)
    assert identity_descriptor(np.ones((32, 32, 32))) is None


def test_exact_and_lsh_searches_find_the_planted_rescans():
    """LSH is sure from IDENTITY_ERROR; planted pairs at ~0.85 are found by both."""
    rng = np.random.default_rng(3)
    n, d = 600, 2872
    prints = rng.standard_normal((n, 30)) @ rng.standard_normal((30, d)) \
        + 4.0 * rng.standard_normal((n, d))
    planted = {(i, n - 1 - i) for i in range(8)}
    for i, j in planted:
        prints[j] = prints[i] + 0.6 * prints[i].std() * rng.standard_normal(d)
    exact_info, lsh_info = {}, {}
    exact = find_identity_matches(prints, method="exact", info=exact_info)
    lsh = find_identity_matches(prints, method="lsh", info=lsh_info)
    assert {(i, j) for i, j, _ in exact} == planted
    assert [(i, j) for i, j, _ in lsh] == [(i, j) for i, j, _ in exact]
    assert min(c for *_, c in exact) > IDENTITY_ERROR
    assert lsh_info["pairs_compared"] < exact_info["pairs_compared"] // 20
    assert lsh_info["lsh_sure_from"] == IDENTITY_ERROR > IDENTITY_WARNING


def test_identity_arguments_are_validated():
    prints = np.random.default_rng(0).standard_normal((4, 8))
    with pytest.raises(ValueError, match="identity search threshold must be in"):
        find_identity_matches(prints, 1.5)
    with pytest.raises(ValueError, match="unknown identity search method 'fast'"):
        find_identity_matches(prints, method="fast")


# -- issue 30: scores against the fixed reference population, whoever else is cached ------

MNI_SHAPE = (197, 233, 189)


def person_on_template(seed: int, template, moved: bool = False) -> np.ndarray:
    """Synthetic person ``seed`` on the template grid by its known rigid truth (what a
    perfect registration gives), z-scored in the head; ``moved``: as a rescan whose
    registration erred by 1 degree and 0.5 mm (the largest errors t1w_mni_rigid makes on
    the calibration set, docs/benchmarks.md), with noise."""
    from mriprep.demo.calibration import person

    anatomy = person(seed)
    error = np.eye(4)
    if moved:
        angle = np.deg2rad(1.0)
        error[:2, :2] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
        error[:3, 3] = [0.4, -0.3, 0.2]
    voxels = np.linalg.inv(anatomy.affine) @ anatomy.template_to_anatomy @ error @ template.affine
    out = ndimage.affine_transform(anatomy.image, voxels[:3, :3], voxels[:3, 3],
                                   output_shape=template.shape, order=1)
    if moved:
        out = out + 0.02 * np.random.default_rng(seed).standard_normal(out.shape)
    head = out > 0.1 * np.percentile(out, 99)
    return ((out - out[head].mean()) / out[head].std()).astype(np.float32)


@pytest.fixture(scope="module")
def other_person(tmp_path_factory) -> dict[str, np.ndarray]:
    """Fingerprints of one synthetic person (the stage tests' person: no demo or
    reference person) and of its moved, noisier copy, on the MNI grid. Built once per test
    run."""

    def build(folder):
        template = load_template("mni152")
        prints = {}
        for name, moved in (("person", False), ("person_moved", True)):
            np.save(folder / f"{name}.npy", person_on_template(TEST_PERSON, template, moved))
            prints[name] = scan_tensor_file(folder / f"{name}.npy", "image").fingerprint
        return prints

    return built_once(tmp_path_factory, "identity_other_person", build)


def entry(name: str, split: str, *, registered: bool = True, shape=MNI_SHAPE,
          affine=None, pipeline: str = "t1w_mni_rigid"):
    """An index entry as `mriprep check` reads it (no tensors: check_index needs none)."""
    import hashlib

    from mriprep.cache import IndexEntry

    digest = hashlib.sha256(name.encode()).hexdigest()
    affine = load_template("mni152").affine if affine is None else affine
    doc = {"subject_id": name.replace("_", "-"), "session_id": "", "split": split,
           "pipeline_name": pipeline, "pipeline_hash": hashlib.sha256(pipeline.encode()).hexdigest(),
           "affine": np.asarray(affine).tolist(), "shape": list(shape),
           "spacing": [float(s) for s in np.linalg.norm(np.asarray(affine)[:3, :3], axis=0)],
           "inputs": {"image": {"path": f"/data/{name}.nii.gz", "sha256": digest}},
           "files": {kind: {"file": f"{kind}.npy", "dtype": dtype, "shape": list(shape),
                            "bytes": 1, "xxh3_128": digest[:32]}
                     for kind, dtype in (("image", "float32"), ("valid", "bool"))},
           "extra_files": ({"transform.tfm": {"file": "transform.tfm", "bytes": 1,
                                              "xxh3_128": digest[32:]}} if registered else {})}
    return IndexEntry.from_json(digest, doc)


def identity_findings(splits: dict[str, str], prints: dict[str, np.ndarray], **kw):
    """(pairs named per code, other identity findings, search info) of check_index on
    entries ``name -> split`` with those fingerprints. A finding is one person: its code
    covers every matched pair among its ids, as its ``details`` list them."""
    from mriprep.check.index import check_index

    index = {}
    for name, split in splits.items():
        e = entry(name, split, **kw)
        index[e.key] = e
    names = {e.key: e.subject_id for e in index.values()}
    keys = {e.subject_id: e.key for e in index.values()}
    info: dict = {}
    found = check_index(index, {keys[n.replace("_", "-")]: prints[n] for n in splits},
                        search_info=info)
    pairs: dict[str, set] = {}
    rest = []
    for f in found:
        if f.code in IDENTITY_CODES:
            assert set(f.keys) == {k for p in f.details["pairs"] for k in p["keys"]}
            pairs.setdefault(f.code, set()).update(
                frozenset(names[k] for k in p["keys"]) for p in f.details["pairs"])
        elif f.code.startswith("identity"):
            rest.append(f)
    return pairs, rest, info


def all_pairs(splits: dict[str, str], who: str) -> set:
    ids = [n for n in splits if n.startswith(who)]
    return {frozenset((a.replace("_", "-"), b.replace("_", "-")))
            for a in ids for b in ids if a < b}


def test_one_person_dominating_a_small_cohort_is_named_across_splits(colin_prints, other_person):
    """Issue 30: Colin27 in train, its 0.5 mm copy in val, its skull-stripped copy in
    test, in a cache of 6 that Colin27 dominates: centred on the cohort, Colin27 was the
    average and nothing was named across splits."""
    splits = {"colin27": "train", "colin27_5mm_noisy": "train", "colin27_05mm": "val",
              "colin27_brain": "test", "person": "train", "person_moved": "train"}
    pairs, _, info = identity_findings(splits, {**colin_prints, **other_person})
    assert info["centre"] == "reference"
    # Colin27 is one person in three splits: one error holding all 6 of its pairs
    assert pairs["identity-leak"] == all_pairs(splits, "colin27")
    assert pairs["near-duplicate"] == {frozenset(("person", "person-moved"))}
    assert "possible-identity-leak" not in pairs  # and Colin27 is nobody else


def test_two_people_pair_colin27_with_its_05mm_copy(colin_prints, other_person):
    """Issue 30: in 5 scans of two people, Colin27 1 mm (train) and its 0.5 mm copy (val)
    were not paired; the thick-slice rescan and the other person's moved copy were."""
    splits = {"colin27": "train", "colin27_05mm": "val", "colin27_5mm_noisy": "test",
              "person": "train", "person_moved": "val"}
    pairs, _, _ = identity_findings(splits, {**colin_prints, **other_person})
    assert frozenset(("colin27", "colin27-05mm")) in pairs["identity-leak"]
    assert pairs["identity-leak"] == all_pairs(splits, "colin27") | {
        frozenset(("person", "person-moved"))}
    assert set(pairs) == {"identity-leak"}


def test_a_pairs_score_does_not_depend_on_the_cohort(colin_prints, other_person):
    prints = {**colin_prints, **other_person}

    def score(names, a="colin27", b="colin27_05mm"):
        [(i, j, corr)] = [p for p in find_identity_matches(np.stack([prints[n] for n in names]),
                                                          0.5)
                          if {names[p[0]], names[p[1]]} == {a, b}]
        return corr

    alone = score(["colin27", "colin27_05mm"])
    crowded = score(["colin27", "colin27_05mm", "colin27_brain", "colin27_5mm_noisy",
                     "person", "person_moved"] + ["colin27_brain"] * 10)
    assert alone == pytest.approx(crowded, abs=1e-6) and alone >= IDENTITY_ERROR


def test_a_cache_of_one_person_is_too_uniform_to_judge(colin_prints):
    splits = {"colin27": "train", "colin27_05mm": "val", "colin27_brain": "test",
              "colin27_5mm_noisy": "test"}
    pairs, [uniform], _ = identity_findings(splits, colin_prints)
    assert uniform.code == "identity-too-uniform" and uniform.severity == "warning"
    assert "one person is under most of their ids" in uniform.message
    assert pairs["identity-leak"] == all_pairs(splits, "colin27")  # still named


def random_prints(names, seed=0) -> dict[str, np.ndarray]:
    from mriprep.check.tensors import FINGERPRINT_BLOCKS
    from mriprep.splits.identity import core_mask

    d = int(core_mask((FINGERPRINT_BLOCKS,) * 3).sum())
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(d).astype(np.float32) for n in names}


def test_a_small_cache_off_the_reference_grid_is_too_few_to_judge():
    """On a grid the reference was not made on, only the cohort's own mean is an average
    person, and 2 entries are not enough for one."""
    affine = np.diag([4.0, 4.0, 4.0, 1.0])
    splits = {"sub_a": "train", "sub_b": "val"}
    pairs, rest, info = identity_findings(splits, random_prints(splits), shape=(50, 59, 48),
                                          affine=affine, pipeline="t1w-4mm", registered=False)
    assert not pairs and not rest
    few = [n for n in info["notes"] if "too few to judge identity" in n]
    assert len(few) == 1 and "2 entries" in few[0] and "t1w_mni_rigid" in few[0]
    assert info["method"] == "skipped"


def test_an_unregistered_pipeline_finds_only_identical_acquisitions():
    names = [f"sub_{i}" for i in range(10)]
    prints = random_prints(names)
    prints["sub_9"] = prints["sub_0"] + 0.1 * np.random.default_rng(1).standard_normal(
        prints["sub_0"].shape).astype(np.float32)  # the same acquisition, noise added
    conformed = np.array([[-1.0, 0, 0, 128], [0, 0, 1, -128], [0, -1, 0, 128], [0, 0, 0, 1]])
    pairs, rest, info = identity_findings(
        {n: "train" if i < 5 else "val" for i, n in enumerate(names)}, prints,
        registered=False, shape=(256, 256, 256), affine=conformed, pipeline="conform_1mm")
    assert pairs == {"identity-leak": {frozenset(("sub-0", "sub-9"))}} and not rest
    assert info["centre"] == "cohort"
    [note] = info["notes"]
    assert "conform_1mm" in note and "only identical acquisitions" in note


# --- one finding per person -------------------------------------------------------------

OFF_REFERENCE = {"shape": (50, 59, 48), "affine": np.diag([4.0, 4.0, 4.0, 1.0]),
                 "pipeline": "t1w-4mm"}


def person_findings(splits: dict[str, str], prints: dict[str, np.ndarray]):
    """The identity findings of check_index on entries ``name -> split`` off the
    reference grid (centred on the cohort), registered."""
    from mriprep.check.index import check_index

    index = {e.key: e for e in (entry(n, sp, **OFF_REFERENCE) for n, sp in splits.items())}
    keys = {e.subject_id: e.key for e in index.values()}
    found = check_index(index, {keys[n.replace("_", "-")]: prints[n] for n in splits},
                        search_info={})
    return [f for f in found if f.code in IDENTITY_CODES]


def strangers_and(person: dict[str, tuple[str, np.ndarray]], strangers: int = 10):
    """(splits, prints) of ``strangers`` unrelated people in train/val/test and the
    scans ``person`` gives (name -> (split, fingerprint))."""
    names = [f"other_{i}" for i in range(strangers)]
    prints = random_prints(names, seed=5)
    splits = {n: ("train", "val", "test")[i % 3] for i, n in enumerate(names)}
    for name, (split, fingerprint) in person.items():
        splits[name], prints[name] = split, fingerprint
    return splits, prints


def mixed(base: np.ndarray, corr: float, seed: int) -> np.ndarray:
    """A fingerprint correlated about ``corr`` with ``base``."""
    noise = np.random.default_rng(seed).standard_normal(base.shape).astype(np.float32)
    return (corr * base + np.sqrt(1 - corr ** 2) * noise).astype(np.float32)


def test_one_person_under_five_ids_is_one_finding_naming_ids_and_splits():
    """Issue 47: one person under 5 ids gave 10 pairwise findings."""
    [base] = random_prints(["p"], seed=9).values()
    person = {f"sub_p{i}": (split, mixed(base, 0.97, i))
              for i, split in enumerate(("train", "train", "val", "val", "test"), 1)}
    splits, prints = strangers_and(person)
    [finding] = person_findings(splits, prints)
    assert finding.code == "identity-leak" and finding.severity == "error"
    assert finding.subjects == tuple(f"sub-p{i}" for i in range(1, 6))
    for i, split in enumerate(("train", "train", "val", "val", "test"), 1):
        assert re.search(rf"sub-p{i} \[\w+\] \({split}\)", finding.message)
    assert "5 subject ids" in finding.message and "3 splits" in finding.message
    details = finding.details
    assert details["ids"] == [f"sub-p{i}" for i in range(1, 6)]
    assert details["splits"] == ["test", "train", "val"]
    assert len(details["pairs"]) == 10  # every pair kept, for --json
    scores = [p["correlation"] for p in details["pairs"]]
    assert details["strongest"] == max(scores) and details["weakest"] == min(scores)
    assert f"{max(scores):.3f}" in finding.message and f"{min(scores):.3f}" in finding.message
    assert finding.to_json()["details"]["pairs"][0]["keys"][0] in finding.keys


def test_a_person_in_one_split_is_one_near_duplicate():
    [base] = random_prints(["p"], seed=9).values()
    person = {f"sub_p{i}": ("train", mixed(base, 0.97, i)) for i in range(1, 4)}
    [finding] = person_findings(*strangers_and(person))
    assert finding.code == "near-duplicate" and finding.severity == "warning"
    assert len(finding.details["pairs"]) == 3 and "3 subject ids" in finding.message
    assert "merge the ids" in finding.message


def test_a_person_joined_across_splits_only_by_weak_matches_is_a_possible_leak():
    """Two scans in train match each other surely; a third in val matches them only
    between the warning and the error threshold: one warning, not an error."""
    [base] = random_prints(["p"], seed=9).values()
    person = {"sub_a": ("train", mixed(base, 0.99, 1)), "sub_b": ("train", mixed(base, 0.99, 2)),
              "sub_c": ("val", mixed(base, 0.76, 3))}
    [finding] = person_findings(*strangers_and(person))
    by_pair = {frozenset(p["subjects"]): p["correlation"] for p in finding.details["pairs"]}
    assert by_pair[frozenset(("sub-a", "sub-b"))] >= IDENTITY_ERROR
    assert IDENTITY_WARNING <= by_pair[frozenset(("sub-a", "sub-c"))] < IDENTITY_ERROR
    assert finding.code == "possible-identity-leak" and finding.severity == "warning"
    assert "(val)" in finding.message and "(train)" in finding.message


def test_shared_deviation_is_the_mean_correlation_over_pairs_of_different_groups():
    from mriprep.splits.identity import shared_deviation
    from mriprep.splits.near_duplicates import normalise_fingerprints

    rng = np.random.default_rng(5)
    person = rng.standard_normal(40)
    rows = rng.standard_normal((9, 40)) + 0.8 * person  # alike: a shared deviation
    # The mean of the others, so the cohort's average: no identity, left out
    rows[4] = rows[np.arange(9) != 4].mean(axis=0)
    groups = np.array(["a", "a", "b", "c", "c", "c", "d", "e", "e"])
    vectors, usable = normalise_fingerprints(rows)
    corr = vectors.astype(np.float64) @ vectors.T.astype(np.float64)
    pairs = (np.triu(np.ones((9, 9), bool), 1) & usable[:, None] & usable[None, :]
             & (groups[:, None] != groups[None, :]))
    assert not usable[4] and pairs.sum() > 10
    assert shared_deviation(rows, groups, centre="cohort") == pytest.approx(
        corr[pairs].mean(), abs=1e-9)
    every = np.triu(np.ones((9, 9), bool), 1) & usable[:, None] & usable[None, :]
    assert shared_deviation(rows, centre="cohort") == pytest.approx(corr[every].mean(),
                                                                    abs=1e-9)
    assert shared_deviation(rows, np.zeros(9), centre="cohort") == 0.0  # one group: no pair
